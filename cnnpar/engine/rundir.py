"""Where a run's files go, and which checkpoint (if any) it resumes from.

Rank 0 decides and broadcasts the decision, so every rank agrees on the folder and the
checkpoint even when their clocks or their views of the file system differ; each rank then
checks that it can see the checkpoint it must read.

`cnnpar train` holds its run folder for the run's life (`run_folder_held`): rank 0 keeps an flock on the
folder's CLAIM_FILE, which the operating system releases when the process ends, killed or not, so a second
run under the same name, or a resume of a run still training, is refused instead of writing over it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from cnnpar.config import (
    NAME_MAX_BYTES,
    SECTIONS,
    Config,
    load_toml,
    path_length_problem,
    read_as_ascii_note,
    setting_name,
    system_path_limits,
)
from cnnpar.data.sources import readable_name, utf8_on_disk
from cnnpar.dist import DistInfo, broadcast_object
from cnnpar.engine.checkpoint import (
    LAST,
    checkpoint_epoch,
    epochs_held,
    find_checkpoint,
    resumed_checkpoint,
    run_dir_of,
)
from cnnpar.engine.resolved import read_started_in, rooted
from cnnpar.errors import UserError
from cnnpar.report.files import (
    TEXT,
    check_out_folder,
    held_by,
    note_holder,
    removed_on_failure,
    stamped_folder_removed_on_failure,
    stamped_name,
    unwritable,
    utf8_text,
)

try:
    import fcntl
except ImportError:  # Windows has no flock: runs there go unclaimed, as they always did
    fcntl = None

CLAIM_FILE = ".cnnpar.lock"  # hidden: nothing that reads a run folder looks at it, and `ls` does not show it


def elastic_restart(info: DistInfo) -> bool:
    """True when torchrun restarted this job's workers after a failure (--max-restarts): the attempt all ranks
    agree on (dist.job_attempt), as a node whose own worker did not fail is restarted with its count still 0."""
    return info.attempt > 0


def torchrun_job_id() -> str:
    """torchrun's job id (--rdzv-id; --standalone makes one per launch), '' when there is none.

    It is the same in every attempt of one launch, so a restarted job finds its folder again.
    A multi-node launch without --rdzv-id gets the literal 'none', which names nothing.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return "" if run_id in ("", "none") else run_id


NO_NAME_TO_RESUME = (
    "--resume auto: no --name to find the run by (a run without one gets a new folder each time): "
    "expected --name NAME or --resume runs/NAME"
)


def launch_stable_job_id() -> bool:
    """A torchrun job id that a later launch can give again (--rdzv-id=myjob), not the random UUID that
    --standalone makes for each launch: only the former can find an earlier launch's folder."""
    run_id = torchrun_job_id()
    if not run_id:
        return False
    try:
        uuid.UUID(run_id)
    except ValueError:
        return True
    return False


def restarts_cannot_find_run(cfg: Config) -> bool:
    """torchrun may restart this job, but a restart would not know which folder to resume."""
    may_restart = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
    return may_restart and not cfg.run.name and not torchrun_job_id()


def default_name(cfg: Config) -> str:
    run_id = torchrun_job_id()
    if run_id:
        return f"{cfg.model.name}-{run_id[:12]}"
    # Named, not made: every Trainer decides its run folder (the doctor's, the bench's too), and only `fit` makes it,
    # at its claim (run_folder_held), by a mkdir that fails where the folder is there: a second run that named the
    # same folder within the same second takes the next free name (-2) there.
    return stamped_name(cfg.run.out_dir, cfg.model.name).name


def named_by_its_stamp(cfg: Config, resumed: bool, world_size: int) -> bool:
    """Whether the run's folder is a new default one, `<model>-<time>` (default_name), whose name its claim may
    change (run_folder_held's `stamped_prefix`). Not under several ranks, which each hold the name rank 0 decided."""
    return not cfg.run.name and not resumed and not torchrun_job_id() and world_size == 1


def same_source(a: str, b: str) -> bool:
    """The same --data, also when typed once as ./train.csv and once as train.csv."""
    return a == b or (Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())


def same_recorded_source(recorded: str, started_in: str | None, now: str) -> bool:
    """`now` names the data a record's `recorded` --data named: as typed (the same relative path typed in another
    folder passes here; the trainer's content check compares the two folders' files), or read from the folder the run
    was started in (a resume from elsewhere, whose relative path cliargs made absolute)."""
    return same_source(recorded, now) or same_source(rooted(recorded, started_in), now)


def refuse_other_data(run_dir: Path, cfg: Config) -> None:
    """A run folder holds one data set's run: another data set's epochs, checkpoint and config.toml
    must not land on top of it (a `--resume auto` that lost its --data would do just that)."""
    stored = run_dir / "config.toml"
    if not stored.is_file():
        return
    try:
        source = load_toml(stored).data.source
        started_in = read_started_in(stored.read_text(**TEXT))
    except UserError:
        return  # an unreadable config.toml is not a run's record worth protecting
    if not same_recorded_source(source, started_in, cfg.data.source):
        source = rooted(source, started_in)  # named as the run read it, in the folder it started in
        raise UserError(
            f"{run_dir}: holds a run on --data {source} (its config.toml), not {cfg.data.source}: "
            f"expected --data {source}, or another --name"
        )


def refuse_unwritable_settings(cfg: Config) -> None:
    """A path that is not UTF-8 (a Latin-1 caf\\xe9, read by the OS as a lone surrogate) cannot be written into the
    run's config.toml, which TOML makes UTF-8: the run failed with a traceback after making its folder. Refused
    here, before anything is made; escaping it there would record a path that names no folder when read back."""
    resume = cfg.run.resume
    if resume and resume != "auto" and resumed_checkpoint(Path(resume)) is not None:
        # --out-dir and --name were read from the folder --resume names (cliargs._read_stored), typed or not
        run_dir = Path(cfg.run.out_dir) / cfg.run.name
        if not utf8_text(str(run_dir)):
            if utf8_on_disk(str(run_dir)):
                raise UserError(
                    f"--resume {readable_name(resume)}: its run folder {readable_name(str(run_dir))} cannot be "
                    f"written into the run's config.toml: {read_as_ascii_note()}"
                )
            raise UserError(
                f"--resume {readable_name(resume)}: its run folder {readable_name(str(run_dir))} is not UTF-8, which "
                "the run's config.toml cannot hold: expected a run folder with a UTF-8 path (rename it)"
            )
    for section in SECTIONS:
        for key, value in vars(getattr(cfg, section)).items():
            if isinstance(value, str) and not utf8_text(value):
                named = f"{setting_name(section, key)} = '{readable_name(value)}'"
                if utf8_on_disk(value):  # UTF-8 on disk, read as lone surrogates: "not UTF-8" sent users renaming it
                    raise UserError(f"{named}: cannot be written into the run's config.toml: {read_as_ascii_note()}")
                raise UserError(
                    f"{named}: not UTF-8, which the run's config.toml cannot hold: expected a UTF-8 path (rename it, "
                    "or link to it by a UTF-8 name)"
                )


RUN_FILES_ROOM = (
    1 + NAME_MAX_BYTES
)  # a file inside the run folder: "/" and one name (a TensorBoard event file's is long)


def _shortened(path: str, keep: int = 40) -> str:
    return path if len(path) <= 2 * keep + 3 else f"{path[:keep]}...{path[-keep:]}"


def refuse_too_long_path(run_dir: Path, named: bool = False) -> None:
    """A run folder whose path the system cannot take (a folder name over NAME_MAX, or a path near PATH_MAX with the
    run's files in it) ended in an OSError traceback at its mkdir: refused here, before anything is made, with the
    rule and limits the other commands' output paths have (config.path_length_problem). --name is held to 255 bytes
    as it is read (config.run_name_problem); `named`: the folder's name is --name's, held here to the limit of the
    file system under --out-dir (eCryptfs takes 143), and said as --name's, not --out-dir's."""
    name_max = system_path_limits(run_dir.parent)[0]
    if named and len(os.fsencode(run_dir.name)) > name_max:
        raise UserError(
            f"{setting_name('run', 'name')} = '{readable_name(_shortened(run_dir.name))}': "
            f"{len(os.fsencode(run_dir.name))} bytes long: expected a folder name of at most {name_max} bytes (the "
            f"limit of the file system under {readable_name(_shortened(str(run_dir.parent)))})"
        )
    too_long = path_length_problem(run_dir, room=RUN_FILES_ROOM)
    if too_long:
        raise UserError(
            f"{setting_name('run', 'out_dir')} = '{readable_name(_shortened(str(run_dir.parent)))}': {too_long}"
        )


def refuse_unwritable_run_place(cfg: Config) -> None:
    """The run folder a train writes (the one a resume continues, or one a --name names that is there), or the
    --out-dir a new one goes under, where no file can be made (a read-only file system, no permission): refused
    before the data is loaded. A new run ended in a traceback at its mkdir, and a resume at its first record."""
    resume = cfg.run.resume
    if resume and resume != "auto":
        ckpt = resumed_checkpoint(Path(resume))
        if ckpt is None:
            # a ckpt file hides the checkpoint: "no finished epoch" there sent the user to --resume auto, which
            # failed after loading the data
            refuse_a_ckpt_not_a_folder(Path(resume), f"--resume {resume}")
            return  # nothing to resume, refused as such later (_decide)
        run_dir, said = run_dir_of(ckpt), f"--resume {resume}"
    else:
        # first: exists() raises on a path the system cannot take
        refuse_too_long_path(
            Path(cfg.run.out_dir) / (cfg.run.name or f"{cfg.model.name}-YYYYMMDD-HHMMSS-NN"), named=bool(cfg.run.name)
        )
        run_dir = Path(cfg.run.out_dir) / cfg.run.name
        said = "--resume auto" if resume else f"--name {cfg.run.name}"
        if not cfg.run.name or not run_dir.is_dir():
            check_out_folder(cfg.run.out_dir, "--out-dir")
            return
    why = unwritable(run_dir)
    if why:
        raise UserError(
            f"{said}: the run folder {run_dir} cannot be written ({why}): expected a run folder where files can be "
            "made (a run writes its checkpoints and records there)"
        )
    refuse_a_ckpt_not_a_folder(run_dir, said)
    # its checkpoints go into ckpt/: a read-only one there (the run folder itself writable) trained a whole epoch
    # and then failed at the first checkpoint
    ckpt_dir = run_dir / "ckpt"
    why = unwritable(ckpt_dir) if ckpt_dir.is_dir() else ""
    if why:
        raise UserError(
            f"{said}: the checkpoint folder {ckpt_dir} cannot be written ({why}): expected a folder where files can "
            "be made (a run writes its checkpoints there)"
        )


def refuse_a_ckpt_not_a_folder(run_dir: Path, said: str) -> None:
    """A run folder whose `ckpt` is a file (or a link to nothing), where its checkpoints go: a train loaded the data
    and then ended in a FileExistsError traceback at its mkdir."""
    ckpt_dir = run_dir / "ckpt"
    if ckpt_dir.is_dir() or not (ckpt_dir.exists() or ckpt_dir.is_symlink()):
        return
    what = "a file" if ckpt_dir.exists() else "a link to nothing"
    raise UserError(
        f"{said}: {ckpt_dir} is {what}: expected a folder there (a run writes its checkpoints in ckpt/); move it "
        "away, or choose another --name"
    )


# what every run folder holds from its start (fit); a loose last.pt is a checkpoint the refusal below names
RUN_FOLDER_MARKS = ("config.toml", "ckpt", CLAIM_FILE, LAST)


def refuse_foreign_folder(run_dir: Path, cfg: Config) -> None:
    """A new run's folder that is there already must be a run's (or empty): `--out-dir . --name mydata` wrote the
    run into an image folder, whose next scan read ckpt/ as one more, empty class."""
    refuse_data_overlap(run_dir, cfg, "another --name or --out-dir")
    if not run_dir.is_dir() or any((run_dir / mark).exists() for mark in RUN_FOLDER_MARKS):
        return
    if any(run_dir.iterdir()):
        raise UserError(
            f"{run_dir}: a folder that holds files but no run (no config.toml, ckpt/ or {CLAIM_FILE}): "
            "expected a new --name (or an empty folder)"
        )


def refuse_data_overlap(run_dir: Path, cfg: Config, expected: str) -> None:
    """A run folder that is, lies in or holds the --data: a run's files would be read as data by its next scan. Also
    for `--resume PATH`: a run folder moved into its image folder was resumed there, writing into the data."""
    data = Path(cfg.data.source)
    if data.exists():
        here, there = run_dir.resolve(), data.resolve()
        if here == there or there in here.parents or here in there.parents:
            where = "is" if here == there else ("is inside" if there in here.parents else "holds")
            raise UserError(
                f"{run_dir}: the run folder {where} the --data {cfg.data.source}: a run's files would be read as "
                f"data: expected {expected}"
            )


class RunFolderInUse(UserError):
    """Another run, still alive, holds the run folder (or saved into it while this one was starting)."""


_held_claims: list[int] = []  # the descriptors of this process's claims


def _drop_inherited_claims() -> None:
    # A forked child (a DataLoader worker) shares the claim's open file, and the flock lasts while any process
    # has it open: a run killed with SIGKILL would stay claimed until its workers noticed and exited.
    for fd in _held_claims:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_claims.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_claims)


def _lock(run_dir: Path, create: bool) -> int | None:
    """A descriptor holding the exclusive flock on run_dir's CLAIM_FILE; None where there is nothing to hold (no
    such file and not `create`, no flock on this system or file system). RunFolderInUse where a live process
    holds it."""
    if fcntl is None:
        return None
    try:
        # opened for writing: NFS emulates flock with byte-range locks, whose exclusive kind needs a writable file
        fd = os.open(run_dir / CLAIM_FILE, os.O_RDWR | (os.O_CREAT if create else 0), 0o666)
    except OSError:  # no claim file (a run from before claims, or none yet), or a folder this user cannot write
        return None
    try:
        pid = held_by(fd)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without locks: unclaimed
            return None
        raise
    if pid is not None:
        holder = f": pid {pid}" if pid else ""  # to stop, or to find among several runs started by one loop
        raise RunFolderInUse(
            f"{run_dir}: a run is using this folder (a cnnpar train still running holds it{holder}): expected that "
            "run to end or be stopped first, or another --name"
        )
    return fd


def refuse_a_live_run(run_dir: Path) -> None:
    """Raise RunFolderInUse where a live run holds `run_dir`; take nothing (`run_folder_held` claims it later)."""
    fd = _lock(run_dir, create=False)
    if fd is not None:
        os.close(fd)


# what starts again a run stopped before its config.toml was written: `--resume RUN` has nothing there to read, and
# the same command as a new run, or with --resume auto, uses its folder (no checkpoint in it is refused)
NOTHING_WRITTEN_AGAIN = "start it again with the command that started it, without --resume (no config.toml there)"


def stopped_line(run_dir: str | Path, saved_epoch: int, again: str, fitting: str = "") -> str:
    """What a stopped run keeps and the command `again` that continues it (`cnnpar train --resume RUN ...`). A run
    stopped in its first epoch has no checkpoint for `--resume RUN` to read, but `--resume auto` starts it again from
    its config.toml: said so, where "nothing to resume" had read as a run lost. One stopped before its config.toml was
    written has nothing `--resume` could read: the command that started it (a new run) starts it again, with
    `fitting` (" --batch-size 16 --grad-accum 2" after running out of memory, which `again` ends with too): as it
    stood it runs out of memory again."""
    if not saved_epoch:
        if not (Path(run_dir) / "config.toml").is_file():
            again_line = NOTHING_WRITTEN_AGAIN
            if fitting:
                again_line = (
                    f"start it again with the command that started it and{fitting} in place of its own, without "
                    "--resume (no config.toml there)"
                )
            return f"stopped before an epoch was saved: nothing to resume in {run_dir}; {again_line}"
        restart = again.replace(f"--resume {shlex.quote(str(run_dir))}", start_again_flags(run_dir))
        return f"stopped: {run_dir} has no finished epoch; start it again from epoch 1 with: {restart}"
    return f"stopped: {kept_line(run_dir, saved_epoch, again)}"


def start_again_flags(run_dir: str | Path) -> str:
    """The flags that start a run folder without a checkpoint again from its config.toml: `--resume auto` finds a
    run by --out-dir and --name, where `--resume RUN` needs a checkpoint."""
    folder = Path(run_dir)
    if folder.name in ("", ".", ".."):  # `--resume .` names no folder of its own
        folder = folder.resolve()
    return f"--resume auto --name {shlex.quote(folder.name)} --out-dir {shlex.quote(str(folder.parent))}"


def kept_line(run_dir: str | Path, saved_epoch: int, again: str) -> str:
    """The epochs a run's checkpoint holds (`saved_epoch` > 0) and the command `again` that continues it: the end of
    a stop's line, and of a failure's after a saved epoch."""
    return f"the checkpoint in {run_dir} holds {epochs_held(saved_epoch)}; continue with: {again}"


@contextlib.contextmanager
def run_folder_held(
    run_dir: Path,
    resumed: Path | None,
    saved_epoch: int,
    info: DistInfo,
    before_any_epoch: Callable[[BaseException], bool],
    stamped_prefix: str = "",
) -> Iterator[Path]:
    """Hold `run_dir` for the block, which gets the folder held: rank 0 claims it (making it where it is new), every
    rank raises RunFolderInUse where another run holds it, or saved into it since this run read its checkpoint
    (`resumed`, which held `saved_epoch`; None and 0 for a new run). Made here, the folder is removed when the block
    fails as `before_any_epoch` accepts (Trainer.fit: bad input before any epoch was saved), while the claim is still
    held: a run under the same name waiting for it cannot have its folder removed under it.

    `stamped_prefix`: `run_dir` is a default name (named_by_its_stamp), `<stamped_prefix>-<time>`: the folder held is
    a new `stamped_folder` beside it, made by a mkdir that fails where the folder is there. Two `cnnpar train`
    started within the same second named the same folder, and the second was refused by the first's claim."""
    if not info.is_main:
        refusal = broadcast_object("", info)
        if refusal:
            raise RunFolderInUse(refusal)
        yield run_dir
        return
    fd = None
    # never removed on a refusal: the folder may be the other run's, made an instant before
    removed_when = lambda e: not isinstance(e, RunFolderInUse) and before_any_epoch(e)  # noqa: E731
    try:
        if stamped_prefix:
            made = stamped_folder_removed_on_failure(run_dir.parent, stamped_prefix, removed_when)
        else:
            made = removed_on_failure(run_dir, removed_when)
        with made as run_dir:
            try:
                fd = _lock(run_dir, create=True)
                if fd is not None:
                    note_holder(fd)  # who holds it, for a refused run to name
                now = checkpoint_epoch(run_dir, resumed)
                if now != saved_epoch:  # another run held it between this run's decision and now, and saved
                    raise RunFolderInUse(
                        f"{run_dir}: another run changed its checkpoint while this one was starting (epoch {now} "
                        f"now, {saved_epoch} before): expected --resume {shlex.quote(str(run_dir))} to continue from "
                        "it, or another --name"
                    )
            except RunFolderInUse as e:
                broadcast_object(str(e), info)
                raise
            broadcast_object("", info)
            if fd is not None:
                _held_claims.append(fd)
            yield run_dir
    finally:
        if fd is not None:
            if fd in _held_claims:
                _held_claims.remove(fd)
            os.close(fd)


def _decide(cfg: Config, restart: bool) -> tuple[str, str | None]:
    """Rank 0's decision: (run folder, checkpoint or None); `restart`: torchrun restarted the job (elastic_restart).
    Raises UserError; creates nothing."""
    refuse_unwritable_settings(cfg)  # a resume rewrites config.toml too, naming its folder as found now
    resume = cfg.run.resume
    if resume and resume != "auto":
        target = Path(resume)
        ckpt = resumed_checkpoint(target)
        if ckpt is None:
            raise no_checkpoint_there(resume)
        run_dir = run_dir_of(ckpt)
        refuse_a_live_run(run_dir)
        if ckpt.parent.name != "ckpt" or not (run_dir / "config.toml").is_file():
            # a loose .pt: its folder would become the run folder (config.toml, metrics.csv, ckpt/ written over
            # whatever is there), with the default data, as nothing records the run's own
            raise UserError(
                f"--resume {resume}: {ckpt} is not in a run folder (RUN/ckpt/{ckpt.name} beside RUN/config.toml): "
                "a resume continues a run in its own folder; expected that run folder or its checkpoint"
            )
        name = cfg.run.name
        # the name given must be this folder's: the same path once resolved (a folder reached through a link
        # keeps its link's name), as cliargs._names_folder compares them
        named = Path(cfg.run.out_dir) / name
        if name and named.resolve() != run_dir.resolve():
            # its config.toml would then record another run's folder (a re-run of a resumed run's config.toml
            # did; so would --out-dir elsewhere)
            raise UserError(
                f"--resume {resume}: continues the run in {run_dir}, not {named} (--name, --out-dir or --config): "
                f"expected neither (a resume writes to its own run's folder only), or --name {name} without "
                f"--resume for a new run"
            )
        refuse_other_data(run_dir, cfg)
        refuse_data_overlap(run_dir, cfg, "the run folder moved out of the data (then --resume its new path)")
        return str(run_dir), str(ckpt)
    if resume == "auto" and not cfg.run.name and not (restart or launch_stable_job_id()):
        # the folder would be a new default name: a run that resumes nothing, where one was asked for
        raise UserError(NO_NAME_TO_RESUME)
    # checked before default_name looks for a free name: its exists() raised on a path the system cannot take
    refuse_too_long_path(
        Path(cfg.run.out_dir) / (cfg.run.name or f"{cfg.model.name}-YYYYMMDD-HHMMSS-NN"), named=bool(cfg.run.name)
    )
    run_dir = Path(cfg.run.out_dir) / (cfg.run.name or default_name(cfg))
    refuse_a_live_run(run_dir)
    refuse_foreign_folder(run_dir, cfg)
    existing = find_checkpoint(run_dir) if run_dir.is_dir() else None
    refuse_other_data(run_dir, cfg)
    if resume == "auto" or restart:
        return str(run_dir), str(existing) if existing else None
    if existing is not None:
        raise UserError(
            f"{run_dir}: already holds a run with a checkpoint: pass --resume auto to continue it, "
            f"or choose another --name"
        )
    return str(run_dir), None


# Said by each rank of a job whose own disk lacks the run folder a resume names
UNSHARED_RUN_FOLDER = "every node must see the run folder (--out-dir on a shared file system)"


def no_checkpoint_there(resume: str, of_a_job: bool = False) -> UserError:
    """The refusal of `--resume PATH` where PATH holds no checkpoint; `of_a_job`: said by a rank of a job, whose
    node may lack a run folder that other nodes have."""
    target = Path(resume)
    if (target / "config.toml").is_file():  # a run stopped before its first checkpoint
        return UserError(
            f"--resume {resume}: {target} has no finished epoch (stopped before its first checkpoint), so nothing to "
            f"continue: expected {start_again_flags(target)}, which starts it again from epoch 1 with its config.toml"
        )
    if of_a_job:
        return UserError(f"--resume {resume}: no checkpoint there; {UNSHARED_RUN_FOLDER}")
    return UserError(
        f"--resume {resume}: no checkpoint there (expected a run folder with ckpt/last.pt, or that folder's "
        "ckpt/last.pt)"
    )


def resume_unseen_here(cfg: Config) -> UserError | None:
    """This node's refusal of `--resume PATH` where PATH holds no checkpoint here, for the ranks of a job to compare
    before their settings (Trainer.__init__): a node without the run folder read its settings from the defaults,
    not from the run's config.toml, and the first setting that differed (an image size it never typed) stood for
    the cause. None for another resume, or where the checkpoint is there."""
    resume = cfg.run.resume
    if not resume or resume == "auto" or resumed_checkpoint(Path(resume)) is not None:
        return None
    return no_checkpoint_there(resume, of_a_job=True)


def resume_auto_record(cfg: Config) -> dict[str, str]:
    """Whether this node holds the config.toml that `--resume auto --name NAME` read its settings from
    (cliargs.stored_run_config), for the ranks of a job to compare before their settings; {} for another resume.
    Found on one node only, the ranks' settings differ in a field nobody typed."""
    if cfg.run.resume != "auto" or not cfg.run.name:
        return {}
    found = (Path(cfg.run.out_dir) / cfg.run.name / "config.toml").is_file()
    return {"run folder for --resume auto": "found" if found else "not found"}


def resolve_run(cfg: Config, info: DistInfo) -> tuple[Path, Path | None]:
    """Return (run folder, checkpoint to resume from or None): rank 0's decision, each rank's view of it.

    Rank 0 names the folder and the checkpoint in it; every other rank finds them under its own --out-dir (or its
    own --resume PATH), not at rank 0's path: a shared file system mounted at another path on another node held
    the run, and rank 0's path named nothing there (or, on a node-local disk, another folder)."""
    decision: tuple[str, str | None] | str
    if info.is_main:
        try:
            decision = _decide(cfg, elastic_restart(info))
        except UserError as e:
            decision = str(e)  # broadcast the refusal too, or the other ranks would wait for a folder
    else:
        decision = ""
    decision = broadcast_object(decision, info)
    if isinstance(decision, str):
        raise UserError(decision)
    run_dir, ckpt = decision
    if info.is_main:
        return Path(run_dir), Path(ckpt) if ckpt is not None else None
    mine = this_nodes_run_dir(cfg, Path(run_dir))
    if ckpt is None:
        return mine, None
    in_mine = mine / Path(ckpt).relative_to(run_dir)
    if not in_mine.is_file():
        theirs = f" (rank 0's is {ckpt})" if str(in_mine) != ckpt else ""
        raise UserError(
            f"{in_mine}: rank 0 resumes from this checkpoint but rank {info.rank} cannot read it{theirs}: "
            f"{UNSHARED_RUN_FOLDER}, mounted at any path"
        )
    return mine, in_mine


def this_nodes_run_dir(cfg: Config, decided: Path) -> Path:
    """The run folder rank 0 `decided`, as this node sees it: the folder of this node's own `--resume PATH`, else
    the folder of that name under this node's own --out-dir."""
    resume = cfg.run.resume
    if resume and resume != "auto":
        ckpt = resumed_checkpoint(Path(resume))
        return run_dir_of(ckpt) if ckpt is not None else decided
    return Path(cfg.run.out_dir) / decided.name
