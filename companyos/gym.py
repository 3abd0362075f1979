"""Gymnasium adapter: CompanyOS as a `gymnasium.Env` of text observations and JSON-text actions.

Importing this module registers `"CompanyOS-v0"`, so `gymnasium.make("CompanyOS-v0", db=...,
task=..., chaos=...)` works after `import companyos.gym` (or in one go:
`gymnasium.make("companyos.gym:CompanyOS-v0", ...)`). It is the only module of the project that
imports gymnasium: `import companyos` and `companyos.env` never load it.
"""

from __future__ import annotations

import numbers
import re
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import gymnasium
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory

from companyos.env import CompanyEnv, spec_from_options
from companyos.observation import Observation
from companyos.runtime import MAX_ACTION_BYTES
from eventstore.encoding import parse_json

ENV_ID = "CompanyOS-v0"
ENTRY_POINT = "companyos.gym:CompanyOSGym"
SAMPLE_CHARSET = "".join(chr(c) for c in range(0x20, 0x7F)) + "\n\t"
"""What `sample()` draws from: printable ASCII and the whitespace of JSON and renderings."""
MAX_ACTION_CHARS = (MAX_ACTION_BYTES - 2) // 6
"""A character is at most 6 bytes of JSON (`\\u001f`) and the string's quotes add 2, so any text
this long that is not JSON fits the log as the (rejected) action it is; JSON actions shrink or grow
by less when re-encoded."""
MAX_OBSERVATION_CHARS = 2**62
"""No real bound: tool results echo what the agent wrote (comments, submissions), so a rendering's
length has no limit the environment enforces."""
SAMPLE_MAX_CHARS = 4096
"""`sample()` without a length draws one up to this (or the space's own bound, if smaller): drawn
up to 2**62 it would try to allocate exabytes, and up to 174,080 each sample costs milliseconds."""
UNSEEDED_RANGE = 2**31
"""Episode seeds drawn from `np_random` lie in [0, 2**31), as CompanyEnv's unseeded resets do."""
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class UnicodeText(spaces.Text):
    """`spaces.Text` over all of Unicode: `contains` takes any str within the length bounds whose
    characters are Unicode scalar values (no lone surrogates), and `sample()` draws from
    `character_set` (SAMPLE_CHARSET).

    Why not a plain Text: a charset must be listed, and listing Unicode's 1.1M scalar values costs
    ~9 s and ~200 MB per space (measured, gymnasium 1.4), yet renderings quote whatever text the
    agent wrote (a ticket comment in any script, emoji), so no smaller charset covers them.
    `flatten`/one-hot encodings of Text only know `character_set`; this space is for text agents.
    """

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A member of the space, its length drawn up to SAMPLE_MAX_CHARS unless the mask or
        probability tuple names one (Gymnasium draws it up to `max_length`)."""
        given = probability if mask is None else mask
        if (mask is not None and probability is not None) or (given is not None and given[0] is not None):
            return super().sample(mask, probability)  # a length given, or Gymnasium's error for both
        longest = min(self.max_length, max(self.min_length, SAMPLE_MAX_CHARS))
        length = int(self.np_random.integers(self.min_length, longest + 1))
        chars = None if given is None else given[1]
        if probability is not None:
            return super().sample(probability=(length, chars))
        return super().sample(mask=(length, chars))

    def contains(self, x: Any) -> bool:
        return (isinstance(x, str) and self.min_length <= len(x) <= self.max_length
                and (x.isascii() or _LONE_SURROGATE.search(x) is None))

    def __repr__(self) -> str:
        sampled = len(self.character_set)
        return f"UnicodeText({self.min_length}, {self.max_length}, sampled from {sampled} chars)"

    def __eq__(self, other: Any) -> bool:
        return type(other) is UnicodeText and super().__eq__(other)


def parse_action(action: Any) -> Any:
    """A JSON action string -> the value it spells; anything else, and a string that is not JSON
    (NaN and Infinity included: they are not JSON), unchanged, so CompanyEnv rejects it as
    malformed_action and logs it as the string the agent sent."""
    if not isinstance(action, str):
        return action
    text = str(action)  # orjson refuses str subclasses: NumPy's str_ (a vector env's array of actions)
    try:
        return parse_json(text)  # as the server reads the same text (a number past a double's range too)
    except ValueError:
        return text


class ObservationView(Mapping):
    """The structured observation in `info["observation"]`: a read-only mapping, not a dict.
    Gymnasium's vector envs merge dict values of infos key by key, recursively, and the
    observation's `result` is None after a reset or rejection and a dict of a tool's own keys
    after a call: `make_vec` crashed ("'numpy.ndarray' object has no attribute 'get'") as soon
    as its envs' results differed. A mapping that is no dict is kept whole, one per env in an
    object array. `dict(view)` is the plain dict (for `json.dumps`)."""

    __slots__ = ("_observation",)

    def __init__(self, observation: Mapping[str, Any]) -> None:
        self._observation = observation

    def __getitem__(self, key: str) -> Any:
        return self._observation[key]  # "text" too: an Observation renders it when asked

    def __iter__(self) -> Iterator[str]:
        return iter(self._observation)

    def __len__(self) -> int:
        return len(self._observation)

    def __repr__(self) -> str:
        return f"ObservationView({dict(self._observation)!r})"

    @property
    def text(self) -> str:
        """The rendering an LLM reads (the env's observation)."""
        return observation_text(self._observation)


def observation_text(observation: Mapping[str, Any]) -> str:
    """The text an LLM reads: the observation's own rendering (an Observation builds it once and
    keeps it), rendered as an Observation would for any other mapping of its keys."""
    if isinstance(observation, Observation) or "text" in observation:
        return observation["text"]
    return Observation(observation).text


class CompanyOSGym(gymnasium.Env):
    """A CompanyEnv (or anything of its shape, such as a RemoteCompanyEnv) as a Gymnasium env.

    Observation: the text rendering an LLM reads (`UnicodeText`). Action: one JSON action string
    (`'{"app": "ticketdesk", "method": "list_tickets", "params": {}}'`) or the action dict; a
    string that is not JSON is passed on as the string, which the environment rejects (with its
    penalty) as it would in process. `info` holds the structured observation (`"observation"`, an
    ObservationView), the wrapped env's info without its episode id, and the episode's `"seed"`.
    `url=` plays a server's episodes (a RemoteCompanyEnv of its own), so `make_vec(..., url=...)`
    gives each sub-env its own.

    The episode id is `self.episode_id`, not in `info`: ids are unique per store, so two episodes
    with the same seed and actions have different ids, and Gymnasium (check_env) requires equal
    infos for them.

    Seeding follows Gymnasium: `reset(seed=s)` plays seed `s` (the same episode as
    `CompanyEnv.reset(seed=s)`) and seeds `self.np_random`; `reset()` without a seed plays a seed
    drawn from `self.np_random`, so a seeded sequence of resets repeats exactly.
    """

    # render_fps only paces video recorders; declared so Gymnasium's checker has one
    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, db: Any = None, durability: str | None = None, task: str | None = None,
                 chaos: str | float | None = None, reward_profile: str | None = None,
                 max_steps: int | None = None, *, env: Any = None, agent: str | None = None,
                 render_mode: str | None = None, url: str | None = None,
                 api_key: str | None = None, rules: int | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, "
                             f"not {render_mode!r}")
        if env is not None and (db is not None or agent is not None or url is not None):
            raise ValueError("pass either env= or the arguments to build one (db=, url=, agent=), not both")
        if url is not None and db is not None:
            raise ValueError("pass either url= (a server's episodes) or db= (a store here), not both")
        # taken and ignored, they read as obeyed: a server logs every step before it answers
        if durability is not None and (env is not None or url is not None):
            raise ValueError("durability= is for a store here (db=): a server (url=) logs every step "
                             "before it answers, and an env= was made with its own")
        if api_key is not None and url is None:
            raise ValueError("api_key= is for a server's episodes (url=)")
        if env is not None and any(other.env is env for other in _OPEN if not other._closed):
            raise ValueError("this env already backs another CompanyOS Gymnasium env, and one env plays "
                             "one episode at a time (make_vec(env=...) gives every sub-env the same one): "
                             "give each its own, e.g. make_vec(..., url=...) for a server's")
        defaults = {key: value for key, value in (("task", task), ("chaos", chaos),
                    ("reward_profile", reward_profile), ("max_steps", max_steps), ("rules", rules))
                    if value is not None}
        # a wrong default is refused here, before any store or connection is opened: at the first
        # reset, Gymnasium's checker would leave the env unusable (see docs/clients.md)
        spec_from_options(0, defaults)
        self.render_mode = render_mode
        self._owns_env = env is None
        if env is None:
            env = (_remote(url, agent, api_key) if url is not None
                   else CompanyEnv(db, durability=durability or "step", agent=agent))
        self.env = env
        self.defaults = defaults
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS, min_length=1, charset=SAMPLE_CHARSET)
        self.action_space = UnicodeText(MAX_ACTION_CHARS, min_length=0, charset=SAMPLE_CHARSET)
        self.episode_id: str | None = None
        self.episode_seed: int | None = None
        self._closed = False
        _OPEN.add(self)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; `options` override the constructor's task, chaos, ... for this one."""
        if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
            seed = int(seed)  # a NumPy integer, as CompanyEnv takes it (Gymnasium's seeding refuses it)
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, UNSEEDED_RANGE))
        # a failed reset leaves no episode, as in the wrapped env: not the last one's id and seed
        self.episode_id = self.episode_seed = None
        if options is None or isinstance(options, Mapping):  # else the env says what is wrong
            # None is "not given", as for the constructor: it played the seed's own task, not the
            # adapter's default
            options = {**self.defaults, **{k: v for k, v in (options or {}).items() if v is not None}}
        observation, info = self.env.reset(seed=seed, options=options)
        self.episode_seed = int(seed)
        return observation_text(observation), self._info(observation, info)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One action (JSON text or dict); what the wrapped env raises, this raises."""
        observation, reward, terminated, truncated, info = self.env.step(parse_action(action))
        return (observation_text(observation), float(reward), bool(terminated), bool(truncated),
                self._info(observation, info))

    def render(self) -> str | None:
        """"ansi": the three apps as they are now, as text (the wrapped env's `render()`)."""
        if self.render_mode is None:
            gymnasium.logger.warn("render() without a render_mode; make the env with render_mode='ansi'")
            return None
        return self.env.render()

    def close(self) -> None:
        """Close the wrapped env if this adapter built it (one passed as env= is the caller's)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_env:
            self.env.close()

    def _info(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        self.episode_id = info.get("episode_id")
        out = {key: value for key, value in info.items() if key != "episode_id"}
        out["observation"] = ObservationView(observation)
        out["seed"] = self.episode_seed
        return out


_OPEN: weakref.WeakSet[CompanyOSGym] = weakref.WeakSet()
"""The adapters alive, to refuse a second one over the same env."""


def _remote(url: str, agent: str | None, api_key: str | None) -> Any:
    """A RemoteCompanyEnv of the server at `url` (imported here: the HTTP client is not needed in
    process)."""
    from companyos.client import RemoteCompanyEnv

    return RemoteCompanyEnv(url, agent=agent, api_key=api_key)


@create_shared_memory.register(UnicodeText)
def _create_unicode_text_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = None) -> Any:
    """Shared memory holds `max_length` characters per env: a bounded space gets Text's, the
    observation space (no bound) a refusal in words. Gymnasium tried to allocate 2**62 characters
    and failed with "cannot fit 'int' into an index-sized integer"."""
    if space.max_length < MAX_OBSERVATION_CHARS:
        text_memory = create_shared_memory.dispatch(spaces.Text)
        return text_memory(space, n) if ctx is None else text_memory(space, n, ctx)
    raise TypeError("CompanyOS observations have no length bound (tool results echo what the agent "
                    "wrote), so they cannot live in shared memory: make the async vector env with "
                    "vector_kwargs={'shared_memory': False}, as Gymnasium asks for spaces of dynamic shape")


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=ENTRY_POINT)


__all__ = ["ENV_ID", "CompanyOSGym", "ObservationView", "UnicodeText", "observation_text", "parse_action"]
