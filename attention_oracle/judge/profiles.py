"""Hypothesis profiles and the problem sizes each one draws.

- ``ci``: extends Hypothesis' built-in "ci" profile (derandomized, no database, no deadline,
  print_blob), sized so ``.ci/run`` finishes well within 20 minutes on 2 CPU cores.
- ``dev``: quick local runs.
- ``gpu``: more and larger examples; bf16 included (the fast kernels run natively there).
- ``fuzz``: thousands of examples, a persistent example database (``.hypothesis/fuzz`` unless
  the plugin passes another: a shared directory for a campaign over several processes or hosts,
  ``fuzzing.py``), and targeted search on the error ratio (``target()`` is fed by the agreement
  rule). ``replay_only``: the database's examples only, no new search.

``size()`` tells the strategies how large to draw ("small" for CPU profiles, "large" for gpu
and fuzz on a GPU). conftest loads the profile; nothing here reads the environment.
"""
from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture]

PROFILES = ("ci", "dev", "gpu", "fuzz")
_EXAMPLES = {"ci": 12, "dev": 6, "gpu": 40, "fuzz": 2000}
_active = {"name": "dev", "size": "small"}
# each check's wall-time budget in seconds (None: none); ``--oracle-check-budget`` overrides it.
# Under ci it spares the covering grid and measures nothing into the verdict (no shape budget):
# the grid, the deterministic floor of what a check covers, always runs whole, and only the
# search after it is cut by time, so that CI on 2 cores ends in minutes (15 s keeps the suite's
# tests under 10 minutes there with the fp32 a-priori term and 3xTF32 member in every grid case);
# fuzz campaigns run as long as they are given
CHECK_BUDGET = {"ci": 15.0, "dev": 60.0, "gpu": 120.0, "fuzz": None}
GRID_SPARED = {"ci": True, "dev": False, "gpu": False, "fuzz": False}
_budget: dict = {}
# the covering grid run before each search (``run/grid.py``): its strength per profile, and the
# length classes (L, S, DSA K, document lengths) per problem size
GRID_STRENGTH = {"ci": 2, "dev": 2, "gpu": 3, "fuzz": 3}
GRID_LENGTHS = {"interpreted": (1, 15, 16, 17, 31, 32, 33),
                "native": (1, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257)}
GRID_LENGTHS["large"] = GRID_LENGTHS["native"] + (1023, 1024, 1025, 4095, 4096, 4097)


def register(fuzz_database: ExampleDatabase | None = None, fuzz_examples: int | None = None,
             replay_only: bool = False) -> None:
    settings.register_profile("ci", settings.get_profile("ci"), max_examples=_EXAMPLES["ci"],
                              deadline=None, suppress_health_check=_SLOW_OK, print_blob=True)
    settings.register_profile("dev", max_examples=_EXAMPLES["dev"], deadline=None,
                              suppress_health_check=_SLOW_OK, print_blob=True)
    settings.register_profile("gpu", max_examples=_EXAMPLES["gpu"], deadline=None,
                              suppress_health_check=_SLOW_OK, print_blob=True, derandomize=True,
                              database=None)
    settings.register_profile("fuzz", max_examples=fuzz_examples or _EXAMPLES["fuzz"], deadline=None,
                              suppress_health_check=_SLOW_OK, print_blob=True,
                              database=fuzz_database or DirectoryBasedExampleDatabase(".hypothesis/fuzz"),
                              phases=[Phase.explicit, Phase.reuse] if replay_only else list(Phase))


def activate(name: str, on_gpu: bool, fuzz_database: ExampleDatabase | None = None,
             fuzz_examples: int | None = None, replay_only: bool = False) -> None:
    """Load profile ``name``; the ``fuzz_*`` arguments shape the fuzz profile (see register)."""
    if name not in PROFILES:
        raise ValueError(f"unknown hypothesis profile {name!r}; expected one of {PROFILES}")
    register(fuzz_database, fuzz_examples, replay_only)
    settings.load_profile(name)
    _active["name"] = name
    _active["size"] = "large" if (on_gpu and name in ("gpu", "fuzz")) else "small"


def name() -> str:
    return _active["name"]


def size() -> str:
    return _active["size"]


def set_check_budget(seconds: float | None) -> None:
    """Override the profile's per-check budget (``--oracle-check-budget``; 0: none)."""
    if seconds is not None and not seconds >= 0:  # NaN too: it would mean no budget
        raise ValueError(f"check budget must be >= 0 seconds, got {seconds}")
    _budget["override"] = None if seconds == 0 else seconds
    _budget["set"] = seconds is not None


def grid_spared() -> bool:
    """Whether the time budget spares the covering grid (and no shape budget applies)."""
    return GRID_SPARED[_active["name"]]


def check_budget() -> float | None:
    """The wall-time budget of one check's search under the active profile (``run/budget.py``)."""
    return _budget["override"] if _budget.get("set") else CHECK_BUDGET[_active["name"]]


def grid_strength() -> int:
    """The covering grid's strength under the active profile (every t-tuple of values)."""
    return GRID_STRENGTH[_active["name"]]


def grid_lengths(interpreted: bool) -> tuple:
    """The length classes of the grid: small tile edges for interpreted kernels, the native
    tile edges on CPU profiles, and also 1023-1025 and 4095-4097 on a GPU (``gpu``, ``fuzz``)."""
    if interpreted:
        return GRID_LENGTHS["interpreted"]
    return GRID_LENGTHS["large" if _active["size"] == "large" else "native"]


def control_settings(max_examples: int = 40) -> settings:
    """Settings for negative controls: search without shrinking, stop at the first failure."""
    return settings(settings(), max_examples=max_examples, phases=[Phase.explicit, Phase.generate],
                    report_multiple_bugs=False, database=None, derandomize=True)
