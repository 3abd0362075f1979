"""Named analytics questions, one `.sql` file each, loaded by `analytics.named`.

File format (the header is the contract: the CLI, the HTTP API and the docs read it):

    -- One line (or more) saying what the question answers.
    -- param NAME TYPE = DEFAULT: what it does      (optional parameter)
    -- param NAME TYPE: what it does                (required parameter)
    SELECT ... WHERE ($NAME IS NULL OR col = $NAME)

TYPE is VARCHAR, INTEGER, DOUBLE, BOOLEAN, CHAOS (a level name such as `medium`, or a number in
[0, 1]), TASK (a task family) or PROFILE (a reward profile); INTEGER may carry a range,
`INTEGER[1..64]`. DEFAULT is NULL, a number, true/false or a 'quoted string'. Parameters are bound by DuckDB
(`$NAME`), never interpolated into the SQL text.
"""
