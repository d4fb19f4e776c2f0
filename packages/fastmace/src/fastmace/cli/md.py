"""``fastmace md STRUCTURE ...`` and ``fastmace run CONFIG.toml``: MD from the command line.

Both call :func:`fastmace.md` with the same settings; a run directory is always written
(default: ``md-<structure name>-<date>-<time>`` in the working directory) and never
overwritten. The config file's keys are ``fm.md``'s keyword arguments plus ``structure``,
``subprocess`` and an ``[environment]`` table (``fm.RunnerConfig``); unknown keys are refused.
A refused request names the flag it was given as (``fastmace md``) or the config file
(``fastmace run``), and an occupied run directory says how to resume in that command's words.
docs/md.md describes both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from fastmace.ensemble_catalog import (
    DEFAULT_ENSEMBLE,
    EnsembleError,
    Setting,
    described_settings,
    descriptors,
    ensemble_names,
    per_system_settings,
    setting_names,
)
from fastmace.runs import MDRequest
from fastmace.vocabulary import DEFAULT_MATMUL_PRECISION, DEFAULT_TIMESTEP_FS, MATMUL_PRECISIONS

# Keys of a run config (TOML) besides the ensemble settings: the structure and fm.md's other
# arguments, but config (an fm.EngineConfig object: a run config gives its fields as keys).
RUN_KEYS = ("structure", *(key for key in MDRequest.keywords() if key != "config"))
# Keys that make the fm.RunnerConfig: run in a child process, extra variables for children.
RUNNER_KEYS = ("subprocess", "environment")


def per_system_keys() -> tuple[str, ...]:
    """A run config's [[systems]] tables: a structure each, and the settings that may differ
    (the ensembles' per-system settings, charge and spin)."""
    return (*per_system_settings(), "charge", "spin")


def _repeat(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeat takes N or A,B,C, got {text!r}") from None
    return counts * 3 if len(counts) == 1 else counts


def _per_system_numbers(
    flag: str, text: str, form: str = "a number or one per system (N1,N2,...)"
) -> float | list[float]:
    """``1`` or one number per system, ``0,1,-1`` (--temperature, --charge, --spin)."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} takes {form}, got {text!r}") from None
    return values[0] if len(values) == 1 else values


def _ladder(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ladder takes LOW,HIGH in K, got {text!r}") from None
    return low, high


def _metavar(setting: Setting) -> str:
    """K, FS, PER_PS, GPA for a number with a unit; N for a whole number; MODE for cell_mode."""
    if setting.whole:
        return "N"
    if setting.choices or not setting.unit:
        return setting.name.rsplit("_", 1)[-1].upper()
    return setting.unit.replace("1/", "PER_").upper()


def _add_ensemble_flag(parser: argparse.ArgumentParser, setting: Setting) -> None:
    """The option of an ensemble setting, from its description: its help names the ensembles
    that take it and its default (each integrator's, applied later: None here)."""
    assert setting.flag is not None
    takers = [known for known in descriptors() if setting.name in known.setting_names]
    defaults = {known.setting(setting.name).default for known in takers}
    notes = [", ".join(known.name for known in takers)]
    if len(defaults) == 1 and None not in defaults:
        notes.append(f"default: {defaults.pop()}")
    text = setting.help
    if setting.per_system and setting.numeric:
        text += "; V1,V2,... gives one per system"

    def value(text: str, flag: str = setting.flag) -> Any:
        if setting.choices:
            return text  # preflight names the choices, and the flag
        if setting.whole:
            try:
                return int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{flag} takes a whole number") from None
        return _per_system_numbers(flag, text)

    parser.add_argument(
        setting.flag,
        type=value,
        dest=setting.name,
        metavar=_metavar(setting),
        help=f"{text} ({'; '.join(notes)})",
    )


def add_parsers(commands: argparse._SubParsersAction) -> None:
    md = commands.add_parser(
        "md", help="run MD of a structure file with a MACE model (writes a run directory)"
    )
    # Each option's help ends with its default: "%(default)s" where argparse holds it, written
    # out where the default is decided later (None here: the timestep of a resumed run is
    # the saved one; an ensemble setting's default is its integrator's). Metavars name units.
    md.add_argument("structure", help="any file ASE reads (the last frame is used)")
    md.add_argument(
        "--model",
        default="demo-emt-cu",
        help="label, template:NAME or path (default: %(default)s)",
    )
    md.add_argument("--sha256", metavar="HEX", help="a model path: its file's SHA-256, checked")
    md.add_argument(
        "--trusted",
        action="store_true",
        default=None,
        help="a model path: load it without a SHA-256 (loading runs code from the file)",
    )
    md.add_argument("--head", help="model head (default: the model's default head)")
    md.add_argument(
        "--ensemble",
        default=DEFAULT_ENSEMBLE,
        help=f"{', '.join(ensemble_names(aliases=True))} (default: %(default)s)",
    )
    for setting in described_settings().values():
        if setting.flag is not None:
            _add_ensemble_flag(md, setting)
    md.add_argument(
        "--steps",
        type=int,
        default=1000,
        metavar="N",
        help="MD steps to run (default: %(default)s)",
    )
    md.add_argument(
        "--initial-temperature",
        type=float,
        dest="initial_temperature_K",
        metavar="K",
        help="draw the starting velocities at this temperature in K (default: the target)",
    )
    md.add_argument(
        "--timestep",
        type=float,
        dest="timestep_fs",
        metavar="FS",
        help=f"time step in fs (default: {DEFAULT_TIMESTEP_FS}; with --resume, the saved one)",
    )
    md.add_argument(
        "--repeat",
        type=_repeat,
        metavar="N|A,B,C",
        help="supercell, e.g. 3 or 4,4,2 (default: none)",
    )
    md.add_argument(
        "--exchange-every",
        dest="exchange_every",
        type=int,
        default=0,
        metavar="N",
        help="replica exchange between the replicas every N steps, 0 for none; --ladder or "
        "--temperature K1,K2,... gives the rungs, lowest first (default: %(default)s)",
    )
    md.add_argument(
        "--max-batch-atoms",
        type=int,
        dest="max_batch_atoms",
        metavar="N",
        help="run the systems in batches of at most N atoms, one after another (default: on "
        "CUDA, sized from the memory measured before the run)",
    )
    md.add_argument(
        "--gpus",
        type=_gpus,
        metavar="N|all",
        help="spread the systems over N GPUs of this machine (or all it has), one process "
        "each, at once (default: one GPU)",
    )
    md.add_argument(
        "--ladder",
        type=_ladder,
        metavar="LOW,HIGH",
        help="temperatures in K from LOW to HIGH in equal ratios, one per replica (for "
        "--exchange-every; instead of --temperature)",
    )
    md.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="copies of each structure in one batch, each with its own random stream "
        "(seed + system index) (default: %(default)s)",
    )
    md.add_argument(
        "--output", "-o", metavar="DIR", help="run directory (default: md-<name>-<date>-<time>)"
    )
    md.add_argument("--resume", action="store_true", help="continue the run in --output")
    md.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the velocities and the thermostat (default: %(default)s)",
    )
    md.add_argument(
        "--traj-every",
        type=int,
        default=100,
        dest="trajectory_every",
        metavar="N",
        help="steps between trajectory frames; 0: none (default: %(default)s)",
    )
    md.add_argument(
        "--thermo-every",
        type=int,
        default=100,
        dest="thermo_every",
        metavar="N",
        help="steps between thermo.csv rows (default: %(default)s)",
    )
    md.add_argument(
        "--restart-every",
        type=int,
        default=10_000,
        dest="restart_every",
        metavar="N",
        help="steps between restart files (default: %(default)s)",
    )
    md.add_argument(
        "--format",
        default="auto",
        dest="trajectory_format",
        metavar="FORMAT",
        help="trajectory: auto, extxyz, h5md, none (default: %(default)s)",
    )
    md.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    md.add_argument("--dtype", help="float32 or float64 (default: the model's)")
    md.add_argument(
        "--backend", default="auto", help="auto, e3nn, cueq, oeq, hybrid (default: %(default)s)"
    )
    md.add_argument(
        "--matmul-precision",
        choices=MATMUL_PRECISIONS,
        dest="matmul_precision",
        help="tf32: the model's matrix products on TF32 tensor cores (CUDA, float32 models; "
        "faster, looser); bf16: its linear layers' GEMMs with BF16 inputs and float32 sums "
        f"(float32 models; docs/md.md) (default: {DEFAULT_MATMUL_PRECISION})",
    )
    md.add_argument(
        "--radial-table", action=argparse.BooleanOptionalAction, default=None,
        dest="radial_table",
        help="read each interaction block's radial weights from a table of the distance "
        "instead of running its radial MLP (--no-radial-table: never; float32 models, within "
        "1e-6 of the MLP: docs/md.md) (default: on for float32 runs on CUDA of models that "
        "allow it)",
    )  # fmt: skip
    md.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=None,
        help="run the model through torch.compile (--no-compile: never): faster steps after "
        "a compilation kept in the cache for later runs (default: on for float32 cuEq runs "
        "on CUDA long enough to pay for it, docs/planner.md)",
    )  # fmt: skip
    md.add_argument(
        "--guard", action="append", type=_bound, metavar="NAME=VALUE|off",
        help="a bound of the physical guard, e.g. max_force_eV_per_A=200 (repeatable), or "
        "off (default: on, with the bounds of docs/md.md)",
    )  # fmt: skip
    add_dispersion_options(md)
    add_charge_options(md)
    md.add_argument(
        "--check", action="store_const", const="gate", dest="check",
        help="compare with mace-torch's float64 model on the structure before running",
    )  # fmt: skip
    md.add_argument(
        "--subprocess", action="store_true", default=None,
        help="run the MD in a child process, isolated from this one (default: in this one)",
    )  # fmt: skip
    md.add_argument(
        "--env", action="append", type=_variable, dest="environment", metavar="NAME=VALUE",
        help="an extra variable for the run's child processes (repeatable)",
    )  # fmt: skip
    # The flag of each setting, for messages about a setting given on the command line.
    flags = {a.dest: a.option_strings[0] for a in md._actions if a.option_strings}
    md.set_defaults(handler=_md, flags=flags)

    run = commands.add_parser("run", help="run MD described by a TOML file (docs/md.md)")
    run.add_argument("config", help="TOML file with fm.md's settings and a structure path")
    run.set_defaults(handler=_run)


def add_dispersion_options(parser: argparse.ArgumentParser) -> None:
    """--dispersion and --dispersion-functional, the same for fastmace md and fastmace relax."""
    parser.add_argument(
        "--dispersion", choices=("d3bj", "d3bj-atm"),
        help="add D3(BJ) dispersion with the model head's functional; d3bj-atm: with its "
        "three-body (ATM) term (docs/md.md)",
    )  # fmt: skip
    parser.add_argument(
        "--dispersion-functional", dest="dispersion_functional",
        help="D3(BJ) parameters of this functional (pbe, r2scan, ...) instead of the model's",
    )  # fmt: skip


def add_charge_options(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """--charge and --spin, the same for fastmace md and fastmace relax; their help says the
    default, so ``default=argparse.SUPPRESS`` keeps a defaults formatter from adding None."""
    parser.add_argument(
        "--charge", type=lambda text: _per_system_numbers("--charge", text), metavar="Q",
        default=default,
        help="total charge in e of each system, for long-range models (MACE-POLAR-1) only; "
        "Q1,Q2,... gives one per system (default: the structure's info 'charge', else 0)",
    )  # fmt: skip
    parser.add_argument(
        "--spin", type=lambda text: _per_system_numbers("--spin", text), metavar="M",
        default=default,
        help="spin multiplicity 2S + 1 of each system (1 singlet, 2 doublet), for long-range "
        "models only; M1,M2,... gives one per system (default: the structure's info 'spin', "
        "else 1)",
    )  # fmt: skip


def _variable(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"--env takes NAME=VALUE, got {text!r}")
    return name, value


def _bound(text: str) -> tuple[str, bool | float]:
    if text == "off":
        return "enabled", False
    name, equals, value = text.partition("=")
    try:
        if not (name and equals):
            raise ValueError(text)
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--guard takes NAME=NUMBER (e.g. max_force_eV_per_A=200) or off, got {text!r}"
        ) from None


def _default_output(structure: str) -> str:
    return f"md-{Path(structure).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def _execute(settings: dict[str, Any], resume_how: str) -> int:
    """Run fm.md with ``settings``; ``resume_how`` tells the user how to continue a run."""
    import fastmace
    from fastmace.io import OccupiedRunDirectoryError

    structure = settings.pop("structure")
    if not settings.get("output"):
        first = structure[0] if isinstance(structure, list) else structure
        settings["output"] = _default_output(str(first))
    in_child, environment = settings.pop("subprocess", False), settings.pop("environment", {})
    if in_child or environment:
        settings["runner"] = fastmace.RunnerConfig(subprocess=in_child, environment=environment)
    try:
        result = fastmace.md(structure, **settings)
    except OccupiedRunDirectoryError as error:
        raise error.advising(resume_how) from None
    print(result.report, end="")
    return 0


def _gpus(text: str) -> int | str:
    """--gpus: a whole number of GPUs, or 'all'."""
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs or 'all'") from None


def _md(args: argparse.Namespace) -> int:
    from fastmace.preflight import RequestError

    options = {key: value for key, value in vars(args).items()
               if key in RUN_KEYS or key in RUNNER_KEYS or key in setting_names()}  # fmt: skip
    options = {key: value for key, value in options.items() if value is not None}
    if args.ladder is not None:
        if "temperature_K" in options:
            raise RequestError("give --ladder or --temperature, not both", "temperature_K")
        from fastmace.dynamics.replica_exchange import geometric_ladder

        if args.replicas < 2:
            raise RequestError("--ladder needs --replicas 2 or more: one replica per rung")
        options["temperature_K"] = geometric_ladder(*args.ladder, args.replicas)
    if "environment" in options:
        options["environment"] = dict(options["environment"])
    if "guard" in options:
        options["guard"] = dict(options["guard"])
    try:
        return _execute(options, resume_how="--resume (the same command with --resume added)")
    except RequestError as error:
        flag = args.flags.get(error.setting or "")
        if flag is None:
            raise
        raise type(error)(f"{error} (given as {flag})", error.setting) from None


def read_config(path: Path) -> dict[str, Any]:
    """A run config: fm.md's keyword arguments plus ``structure``, ``subprocess = true`` and an
    ``[environment]`` table of extra variables (``fm.RunnerConfig``); unknown keys refused.

    Relative ``structure``, ``output`` and ``checkpoint`` paths are relative to the file.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with path.open("rb") as stream:
            config = tomllib.load(stream)
    except OSError as error:
        raise FileNotFoundError(f"cannot read the run config {path}: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path} is not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not a run config: it holds bytes that are not UTF-8 text (at byte "
            f"{error.start}), and a run config is a TOML text file (docs/md.md shows one)"
        ) from None
    known = set(RUN_KEYS) | set(RUNNER_KEYS) | set(setting_names()) | {"systems"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(
            f"{path}: unknown key(s) {', '.join(unknown)}; the keys are: {', '.join(sorted(known))}"
        )
    if "trusted" in config and not isinstance(config["trusted"], bool):
        raise ValueError(f"{path}: trusted = {config['trusted']!r} must be true or false")
    if "sha256" in config and not isinstance(config["sha256"], str):
        raise ValueError(f"{path}: sha256 = {config['sha256']!r} must be a string of 64 hex digits")
    systems = config.pop("systems", None)
    if systems is not None and "structure" in config:
        raise ValueError(f"{path}: give either structure = ... or [[systems]] tables, not both")
    if systems is None and "structure" not in config:
        raise ValueError(
            f"{path}: the key 'structure' (a structure file) or [[systems]] tables are required"
        )
    if systems is not None:  # the tables' structures, their paths already resolved
        config.update(_systems(path, systems, config))
        _check_kinds(path, {**config, "structure": config["structure"][0]})
    else:
        _check_kinds(path, config)
    for key in ("structure", "output", "checkpoint"):
        value = config.get(key)
        if isinstance(value, str) and not Path(value).expanduser().is_absolute():
            config[key] = str(path.parent / value)
    return config


def _systems(path: Path, systems: Any, config: dict[str, Any]) -> dict[str, Any]:
    """``[[systems]]`` tables as fm.md's arguments: the structure paths (relative to the file)
    and each per-system setting as a list, one value per system (the file's top-level value
    where a table has none), each repeated for the system's replicas."""
    if (
        not isinstance(systems, list)
        or not systems
        or not all(isinstance(table, dict) for table in systems)
    ):
        raise ValueError(f"{path}: systems must be [[systems]] tables, each with a structure")
    structures = []
    for number, table in enumerate(systems, start=1):
        unknown = sorted(set(table) - {"structure", *per_system_keys()})
        if unknown:
            keys = ", ".join(per_system_keys())
            raise ValueError(
                f"{path}: system {number} has key(s) {', '.join(unknown)} that cannot differ "
                f"per system; a [[systems]] table takes structure and {keys}"
            )
        if not isinstance(table.get("structure"), str) or not table["structure"]:
            raise ValueError(f'{path}: system {number} needs structure = "FILE" (a path)')
        file = Path(table["structure"]).expanduser()
        structures.append(str(file if file.is_absolute() else path.parent / file))
    copies = config.get("replicas", 1) if isinstance(config.get("replicas", 1), int) else 1
    found: dict[str, Any] = {"structure": structures}
    for key in per_system_keys():
        if not any(key in table for table in systems):
            continue
        values = []
        for number, table in enumerate(systems, start=1):
            value = table.get(key, config.get(key, _default_of(key)))
            if value is None:
                raise ValueError(
                    f"{path}: system {number} has no {key}, and the file gives none for all"
                )
            values += [value] * copies
        found[key] = values
    return found


def _default_of(key: str) -> Any:
    """The value a [[systems]] table takes for a per-system key that neither it nor the file
    gives: the setting's default (None where it has none, as a thermostat's temperature)."""
    from fastmace.charges import DEFAULT_CHARGE, DEFAULT_SPIN_MULTIPLICITY

    defaults = {"charge": DEFAULT_CHARGE, "spin": DEFAULT_SPIN_MULTIPLICITY}
    described = described_settings().get(key)
    return described.default if described is not None else defaults.get(key)


def _check_kinds(path: Path, config: dict[str, Any]) -> None:
    """Refuse values of the wrong kind (``temperature_K = "hot"``), naming the file."""
    from fastmace.preflight import RequestError, RequestTypeError, check_arguments

    if not isinstance(config["structure"], str) or not config["structure"]:
        raise RequestTypeError(
            f"{path}: structure = {config['structure']!r} is not allowed: give the path of a "
            'structure file, as a string (structure = "NaCl.cif")',
            "structure",
        )
    if "subprocess" in config and not isinstance(config["subprocess"], bool):
        raise RequestTypeError(
            f"{path}: subprocess = {config['subprocess']!r} must be true or false", "subprocess"
        )
    if "environment" in config and not isinstance(config["environment"], dict):
        raise RequestTypeError(
            f"{path}: environment must be a table of variables ([environment] with NAME = "
            f'"value" lines), got {config["environment"]!r}',
            "environment",
        )
    arguments = {key: value for key, value in config.items() if key not in RUNNER_KEYS}
    try:
        check_arguments(arguments, look=False)  # the files are looked at once paths resolve
    except RequestError as error:
        raise type(error)(f"{path}: {error}", error.setting) from None
    except EnsembleError as error:
        raise EnsembleError(f"{path}: {error}") from None


def _run(args: argparse.Namespace) -> int:
    from fastmace.preflight import RequestError

    path = Path(args.config)
    try:
        return _execute(read_config(path), resume_how=f"resume = true in {path}")
    except RequestError as error:
        if str(error).startswith(f"{path}:"):
            raise
        raise type(error)(f"{path}: {error}", error.setting) from None
