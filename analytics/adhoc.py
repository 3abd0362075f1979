"""What `companyos analytics sql` lets through: one statement that only reads the warehouse.

The warehouse is opened read-only for ad-hoc SQL, but DuckDB still runs, on a read-only
connection, statements that write files (`COPY ... TO`, `EXPORT DATABASE`), open other databases
(`ATTACH`), install or load extensions and change settings. So each statement is classified by
DuckDB's own parser (`duckdb.extract_statements`) before it runs, and only queries pass.
"""

from __future__ import annotations

import re

import duckdb

ST = duckdb.StatementType

WRITES = "`analytics sql` is read-only: the warehouse is derived from the store, so an edit would " \
         "disagree with its checkpoint (`companyos analytics sync --rebuild` builds it afresh)"
FILES = "`analytics sql` is read-only and writes no files: use `--format csv` or `--format json` " \
        "and redirect the output, or `companyos analytics export DIR` for Parquet"
DATABASES = "`analytics sql` reads this warehouse only and opens no other database"
EXTENSIONS = "`analytics sql` loads no extensions: the warehouse uses only what DuckDB has built in"
SETTINGS = "`analytics sql` does not change DuckDB's settings"
NOT_A_QUERY = "`analytics sql` runs one query (SELECT, WITH, FROM, VALUES, PIVOT, DESCRIBE, SHOW, " \
              "SUMMARIZE, EXPLAIN or a PRAGMA that shows something); for a table function use " \
              "SELECT * FROM f(...)"

REASONS: dict[duckdb.StatementType, str] = {
    **dict.fromkeys((ST.INSERT, ST.UPDATE, ST.DELETE, ST.MERGE_INTO, ST.CREATE, ST.CREATE_FUNC,
                     ST.DROP, ST.ALTER, ST.VACUUM, ST.COPY_DATABASE, ST.ANALYZE), WRITES),
    **dict.fromkeys((ST.COPY, ST.EXPORT), FILES),
    **dict.fromkeys((ST.ATTACH, ST.DETACH), DATABASES),
    **dict.fromkeys((ST.LOAD, ST.EXTENSION), EXTENSIONS),
    ST.SET: SETTINGS,
}
"""Why each kind of statement is refused; a kind not listed here and not a query is NOT_A_QUERY."""
WORD_REASONS = {"IMPORT": WRITES, "USE": DATABASES}
"""Statements DuckDB files under a broader kind: IMPORT DATABASE is a PRAGMA, USE a SET."""

READ_PRAGMAS = frozenset({
    "show_tables", "show_tables_expanded", "show_databases", "table_info", "show", "database_list",
    "database_size", "storage_info", "metadata_info", "version", "platform", "functions",
    "collations", "user_agent"})
"""PRAGMAs that only show something; the others switch settings (`enable_profiling`, ...)."""

QUERY_WORDS = frozenset({"SELECT", "WITH", "FROM", "VALUES", "TABLE", "PIVOT", "PIVOT_WIDER",
                         "UNPIVOT", "DESCRIBE", "DESC", "SHOW", "SUMMARIZE"})
"""Leading words of a query; DuckDB files any statement holding a PIVOT (even a `COPY (PIVOT ...)
TO`) under MULTI, so such a statement passes only when it starts like a query."""

_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)
_WORD = re.compile(r"[A-Za-z_]+")
_OPTIONS = re.compile(r"\([^)]*\)")


class SqlRefused(ValueError):
    """The ad-hoc SQL is not one statement that only reads: a wrong call, said in words."""


def check(sql: str) -> None:
    """Raise SqlRefused unless `sql` is exactly one statement that only reads the warehouse."""
    statements = _parse(sql)
    if not statements:
        raise SqlRefused("no SQL statement to run")
    if len(statements) > 1:
        raise SqlRefused(f"one statement at a time: {len(statements)} were given (separated by ';')")
    _check_one(_kind(statements[0]), statements[0].query)


def _parse(sql: str) -> list:
    """DuckDB's statements of `sql`; a syntax error is the caller's mistake, in one line."""
    try:
        return duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlRefused(one_line(str(exc))) from None


def _kind(statement: duckdb.Statement) -> duckdb.StatementType | None:
    """The statement's kind; None for one this DuckDB's Python enum lacks (`UPDATE EXTENSIONS`
    was a traceback: "29 is not a valid StatementType")."""
    try:
        return statement.type
    except ValueError:
        return None


def _check_one(kind: duckdb.StatementType | None, text: str) -> None:
    """Let a query through; refuse anything else with the reason its kind is refused."""
    word, rest = _leading_word(text)
    if kind is None:
        raise SqlRefused(f"{word or 'this statement'} is refused: {WORD_REASONS.get(word, NOT_A_QUERY)}")
    if kind == ST.SELECT or (kind == ST.MULTI and word in QUERY_WORDS):
        return
    if kind == ST.EXPLAIN:
        _check_explained(rest)  # EXPLAIN ANALYZE runs its statement: `EXPLAIN ANALYZE COPY` writes
        return
    if kind == ST.PRAGMA and word == "PRAGMA":
        name = _leading_word(rest)[0].lower()
        if name in READ_PRAGMAS:
            return
        raise SqlRefused(f"PRAGMA {name} is refused: {SETTINGS} (PRAGMAs that only show something, "
                         "such as show_tables and table_info, run)")
    raise SqlRefused(f"{word or kind.name} is refused: {_reason(kind, word)}")


def _reason(kind: duckdb.StatementType, word: str) -> str:
    """Why a statement of this kind, starting with this word, is refused."""
    if word in WORD_REASONS:
        return WORD_REASONS[word]
    if kind in (ST.MULTI, ST.PRAGMA):  # a statement holding a PIVOT, or `COPY FROM DATABASE`
        kind = ST.__members__.get(word, kind)  # filed as a PRAGMA: judge it by its first word
    return REASONS.get(kind, NOT_A_QUERY)


def _check_explained(rest: str) -> None:
    """Check the statement after EXPLAIN's `ANALYZE` or `(options)`, as if it ran on its own."""
    word, after = _leading_word(rest)
    options = _OPTIONS.match(rest, _NOISE.match(rest).end())
    if options and word not in QUERY_WORDS:  # `(FORMAT json, ANALYZE)`, not `(SELECT ...)`
        rest = rest[options.end():]
    elif word in ("ANALYZE", "ANALYSE"):
        rest = after
    statements = _parse(rest)
    if len(statements) != 1:
        raise SqlRefused(f"EXPLAIN is refused here: {NOT_A_QUERY}")
    _check_one(_kind(statements[0]), statements[0].query)


def _leading_word(text: str) -> tuple[str, str]:
    """The first keyword of `text` (upper case, past comments and opening parentheses) and the
    text after it."""
    position = _NOISE.match(text).end()
    while text.startswith("(", position):
        position = _NOISE.match(text, position + 1).end()
    word = _WORD.match(text, position)
    if word is None:
        return "", text[position:]
    return word.group().upper(), text[word.end():]


def one_line(message: str) -> str:
    """DuckDB's message without the `LINE 1: ...` excerpt and caret under it: one error line."""
    lines = []
    for line in message.strip().splitlines():
        if line.startswith("LINE "):
            break
        if line.strip():
            lines.append(line.strip())
    return " ".join(lines) or message.strip()
