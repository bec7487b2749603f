"""What a resume must keep from the run it continues, and what it changed.

A resumed run reads the data its checkpoint trained on, as it was, and keeps the seed, hold-out and optimizer: the
`refuse_*` checks stop it, before anything in the run folder changes, where it would not continue that run. The
training settings it was given otherwise are said (`changed_settings`, the `resume:` line) and recorded, one row a
setting, in the run folder's resumes.csv (`recorded_changes`, `record_resumes`). The Trainer's `_restore`
(engine/trainer.py) asks here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cnnpar.config import EARLIER_DEFAULTS, Config, as_stored_now, to_dict
from cnnpar.data import DataBundle
from cnnpar.data.bundle import NO_HOLDOUT, first_five, holdout_label
from cnnpar.data.loader import decodes_on_gpu
from cnnpar.data.sources import ARRAYS_CHECKSUM, STORE_CHECKSUM
from cnnpar.data.transforms import resolve_augment
from cnnpar.engine.data_identity import content_difference
from cnnpar.engine.resolved import rooted
from cnnpar.engine.rundir import same_recorded_source
from cnnpar.errors import UserError
from cnnpar.report.files import read_csv, write_csv_atomic

# resumes.csv: one row a setting a resume changed, from the first epoch trained with its new value (config.toml
# holds the newest values only: the epochs before were trained with `before`); `note` says where the change came from
# when the user did not ask for it: a default changed since the checkpoint, or an older cnnpar's reading of "auto"
RESUME_COLUMNS = ["from_epoch", "setting", "before", "after", "note"]
DEFAULT_CHANGED = "default changed in this cnnpar"
OLDER_AUGMENT = "before: as the older cnnpar that wrote the checkpoint drew it"
# what names the run or how it reports, not what its epochs trained with: left out of resumes.csv
NOT_TRAINING_SETTINGS = {
    "run": ("out_dir", "name", "resume", "progress", "monitor", "tensorboard"),
    "dist": ("nproc", "debug_single"),  # the processes that ran are compared instead (the checkpoint's world size)
    # what the data decides: a resume on other data, shape or classes is refused (refuse_changed_data), while the
    # record it resumes from holds these as found (the image size an auto found), the checkpoint as asked
    # (--labels too: where the CSV is, not what it holds, which the data checksum compares)
    "data": ("source", "labels", "format", "image_size", "image_shape", "num_classes", "synthetic_samples"),
}
# (section, field, why): what a resumed run must keep from the run it continues (ResumeChecks.refuse_changed_fields)
RESUME_FIXED = (
    (
        "run",
        "seed",
        "the seed draws the run's shuffle, augmentation, dropout and any seeded validation hold-out (and synthetic "
        "data's images): the resumed epochs would not continue the run",
    ),
    ("data", "val_fraction", "it chose the validation hold-out, which would then hold images the run trained on"),
    ("optim", "optimizer", "the checkpoint holds that optimizer's state"),
)


def resolved_augment(augment: str, bundle: DataBundle, grey: bool | None = None) -> str:
    """--augment as this cnnpar trains with it on this run's data: a resume's data and image size are the
    checkpoint's (another is refused), so the checkpoint's auto resolves on them as it did for its run where
    the checkpoint was written by a cnnpar with today's rule; _older_augment tells the checkpoints that were
    not, and `grey` (ResumeChecks._grey_then) an older reading of a store's grey photos as colour."""
    return resolve_augment(augment, bundle.shape, bundle.loader_crops, bundle.grey if grey is None else grey)


def record_resumes(path: Path, saved_epoch: int, changes: list[dict], written: Callable, log: Callable) -> str:
    """Write resumes.csv (rank 0): the rows of earlier resumes whose epochs this run keeps (a row from an epoch
    past its checkpoint's was for epochs trained again now), then this resume's. Returns the config.toml
    header line that points to it ("" where no resume changed a setting: a stale file is removed)."""
    kept = []
    if path.is_file():
        for row in read_csv(path):
            epoch = row.get("from_epoch") or ""
            if epoch.isdigit() and int(epoch) <= saved_epoch:
                kept.append(row)
    rows = kept + changes
    with written(path):
        if not rows:
            path.unlink(missing_ok=True)
            return ""
        write_csv_atomic(path, rows, RESUME_COLUMNS)
    if changes:
        said = ", ".join(
            f"{r['setting']} {r['before']} -> {r['after']}" + (f" ({r['note']})" if r.get("note") else "")
            for r in changes
        )
        first = saved_epoch + 1
        log(f"record: changed from epoch {first} on, kept in {path} (config.toml holds the new values): {said}")
    return "# resumed with other settings: resumes.csv names each one changed, and from which epoch\n"


@dataclass
class ResumeChecks:
    """The checks of one resume, against the run as this process built it: its config (as run and as asked), its
    data (`bundle`, and `meta`, what the checkpoint stores of the data), its process count; `log` says what was
    allowed (a copy of the data elsewhere, an older cnnpar's class names)."""

    cfg: Config
    requested_cfg: Config
    bundle: DataBundle
    meta: dict
    world_size: int
    log: Callable

    def changed_settings(self, state: dict, peaks: list[float], lr: float, averaging: bool) -> str:
        """The training settings a resume was given otherwise than its checkpoint's run (they apply from the first
        resumed step), in words, or "": a --schedule, --ema or --label-smoothing changed on resuming changed the lr,
        the scored weights or the loss column part way through the run without a word. So did --loader, which draws
        the crops and flips its own way (the hold-out and the sample order stay the run's: named, not refused).
        Another process count or global batch is named first (_global_batch_change); --epochs has a line of its own
        (schedule:), --seed, --val-fraction and --optimizer are refused."""
        stored, now = state.get("config", {}), to_dict(self.cfg)
        said_elsewhere = {("optim", "optimizer"), ("optim", "grad_accum")}
        fields = [("optim", name) for name in now["optim"]] + [("data", "augment"), ("data", "crop_min_scale")]
        fields += [("data", "loader"), ("run", "tta_level")]
        why = {
            ("data", "loader"): "the resumed epochs draw their crops and flips as the other loader does",
            ("optim", "ema"): "the checkpoint's weight average is dropped: validation scores the trained weights"
            if "average" in state and not averaging
            else "",
            ("optim", "label_smoothing"): "the train loss column measures another loss from here",
        }
        changes = [change] if (change := self._global_batch_change(state, peaks, lr)) else []
        for section, name in fields:
            was, is_now = as_stored_now(section, name, stored.get(section, {}).get(name)), now[section][name]
            reason = why.get((section, name), "")
            if (section, name) == ("data", "augment"):  # kept as asked: auto is compared as what it draws
                if (augment := self._augment_change(stored.get("data", {}), self._grey_then(state))) is None:
                    continue
                was, is_now, older = augment
                reason = reason or older
            elif (section, name) in said_elsewhere or was is None or was == is_now:
                continue
            flag = "--" + name.replace("_", "-")
            changes.append(f"{flag} {was} -> {is_now}" + (f" ({reason})" if reason else ""))
        return ", ".join(changes)

    def recorded_changes(self, state: dict, from_epoch: int) -> list[dict]:
        """resumes.csv's rows for this resume: every training setting (NOT_TRAINING_SETTINGS left out) whose value
        differs from the checkpoint's run's, and the process count, from `from_epoch` on. --augment auto that
        resolves to the augmentation it replaces is no change, as in the `resume:` line."""
        stored, now = state.get("config", {}), to_dict(self.cfg)
        rows = []
        was_world = state.get("world_size")
        if isinstance(was_world, int) and was_world != self.world_size:
            rows.append({"setting": "processes", "before": was_world, "after": self.world_size})
        for section, values in now.items():
            for name, is_now in values.items():
                was, note = as_stored_now(section, name, stored.get(section, {}).get(name)), ""
                if (section, name) == ("data", "augment"):
                    if (augment := self._augment_change(stored.get("data", {}), self._grey_then(state))) is None:
                        continue
                    was, is_now, note = augment
                    if not note:  # asked for: the values as typed, as every other row holds them
                        was, is_now = stored["data"]["augment"], self.cfg.data.augment
                elif name in NOT_TRAINING_SETTINGS.get(section, ()) or was is None or was == is_now:
                    continue
                elif self._changed_default(section, name, was):
                    if (section, name) == ("data", "gpu_resize") and not decodes_on_gpu(self.cfg, self.bundle):
                        continue  # it resizes a GPU decoder's crops: neither value acts on this run
                    note = DEFAULT_CHANGED
                rows.append({"setting": f"{section}.{name}", "before": was, "after": is_now, "note": note})
        return [{"from_epoch": from_epoch, **row} for row in rows]

    def _changed_default(self, section: str, name: str, was) -> bool:
        """Whether a stored value that differs from this run's is the default of the cnnpar that wrote the
        checkpoint (config.EARLIER_DEFAULTS), met by today's default where the user asked for no other value: the
        default changed, not the user's setting."""
        asked = getattr(getattr(self.requested_cfg, section), name)
        return was in EARLIER_DEFAULTS.get((section, name), ()) and asked == getattr(getattr(Config(), section), name)

    def _older_augment(self, stored_data: dict) -> tuple[str, str] | None:
        """How a checkpoint written by an older cnnpar drew its photos' training crops and what its --augment
        resolved to there, as (crops, augment), where that cnnpar's rule was not today's; None where it was (or
        the data are arrays, whose rule did not change).

        Before 2026-11-30 (2e778d5) cnnpar read a photo folder's training images as their centre crops (the GPU
        decoder alone drew random-resized crops), and auto added pad-4 crops + flips on top. Its configs hold
        neither data.cpu_share (added an hour later) nor a gpu_resize other than its default then, "loop" (the
        default became "batched" with that change). Until 2026-12-04 (425af3f) the textbook loader read photos
        as centre crops too; its configs lack data.crop_min_scale (added then)."""
        if not self.bundle.loader_crops or "augment" not in stored_data:
            return None
        augment, textbook = stored_data["augment"], stored_data.get("loader") == "textbook"
        if "cpu_share" not in stored_data and stored_data.get("gpu_resize", "loop") == "loop":
            gpu = not textbook and stored_data.get("decode") in ("gpu", "nvimgcodec")
            return ("random-resized crops" if gpu else "centre crops"), resolve_augment(augment, self.bundle.shape)
        if textbook and "crop_min_scale" not in stored_data:
            return "centre crops", resolve_augment(augment, self.bundle.shape, loader_crops=True)
        return None

    def _grey_then(self, state: dict) -> bool:
        """Whether the checkpoint's run read its images as grey: a store prepared before session 34, read as grey
        from its pixels now, was colour to a cnnpar that did not (its checkpoint's meta lacks grey_from_pixels), and
        its --augment auto mirrored them."""
        if self.bundle.grey_from_pixels and not state.get("meta", {}).get("grey_from_pixels"):
            return False
        return self.bundle.grey

    def _augment_change(self, stored_data: dict, grey_then: bool) -> tuple[str, str, str] | None:
        """(before, after, why) where the resumed epochs draw their augmentation otherwise than the checkpoint's
        did, else None: another --augment (auto compared as what it resolves to), or the same one read otherwise
        by the older cnnpar that wrote the checkpoint (why: OLDER_AUGMENT)."""
        was, is_now = stored_data.get("augment"), self.cfg.data.augment
        if was is None:
            return None
        resolved = resolved_augment(is_now, self.bundle)
        older = self._older_augment(stored_data)
        if older is None:
            if was == is_now or resolved_augment(was, self.bundle, grey_then) == resolved:
                return None
            return self._augment_shown(was, grey_then), self._augment_shown(is_now), ""
        crops, was_resolved = older
        now_crops = f"random-resized crops of {100 * self.cfg.data.crop_min_scale:g}-100 % of the area"
        if crops == "random-resized crops" and was_resolved == resolved:
            return None

        def drawn(augment: str, resolved: str, crops: str) -> str:
            return f"{augment} ({'' if resolved == 'none' else resolved + ' of '}{crops})"

        return drawn(was, was_resolved, crops), drawn(is_now, resolved, now_crops), OLDER_AUGMENT

    def _augment_shown(self, augment: str, grey: bool | None = None) -> str:
        return f"auto ({resolved_augment(augment, self.bundle, grey)})" if augment == "auto" else augment

    def _global_batch_change(self, state: dict, peaks: list[float], lr: float) -> str:
        """Another process count or global batch than the checkpoint's run, and whether the peak lr followed
        (--lr-scaling), in words, or "": `--resume --nproc 1` of a 2-process run halved the batch each step averages
        over, said only as "processes, batch, --grad-accum or --max-steps differ" in the schedule's line. Checkpoints
        written before they stored their world size name a change of the per-process batch or accumulation only."""
        was_world = state.get("world_size")
        stored = state.get("config", {})
        was_batch = stored.get("run", {}).get("batch_size")
        was_accum = stored.get("optim", {}).get("grad_accum")
        if not (isinstance(was_batch, int) and isinstance(was_accum, int) and was_batch > 0):
            return ""
        world = self.world_size
        old_world = was_world if isinstance(was_world, int) else world
        was_global = was_batch * was_accum * old_world
        now_global = self.cfg.run.batch_size * self.cfg.optim.grad_accum * world
        # this run's peak against the checkpoint's run's, group 0 of each (the same group: the grouping is the same)
        was_peaks = state.get("scheduler", {}).get("base_lrs") or []
        was_lr = lr * was_peaks[0] / peaks[0] if was_peaks and peaks and peaks[0] else lr
        if old_world == world and was_global == now_global:
            return ""
        if was_global == now_global:
            details = [f"global batch {now_global} per step as before"]
        else:
            details = [f"global batch {was_global} -> {now_global} per step"]
        scaling = f"--lr-scaling {self.cfg.optim.lr_scaling}"
        if math.isclose(was_lr, lr, rel_tol=1e-9):
            if was_global != now_global and old_world != world:
                details.append(f"lr not rescaled: {scaling}")
            elif was_global != now_global:  # --lr-scaling follows the process count, which did not change
                details.append("lr not rescaled: the per-process batch or accumulation changed, not the processes")
        else:
            details.append(f"peak lr {was_lr:g} -> {lr:g}: {scaling}")
        if old_world == world:
            return f"{details[0]}" + (f" ({details[1]})" if len(details) > 1 else "")
        return f"processes {old_world} -> {world} ({'; '.join(details)})"

    def refuse_changed_data(self, path: Path, stored: dict, was: dict, started_in: str | None = None) -> None:
        """A resumed run reads the data its checkpoint trained on, as it was. Rows added under the same path
        re-draw the seeded hold-out (validation would score images the finished epochs trained on); a renamed
        class folder moves classes to other indices (the outputs would mean other classes); another image size
        fits a globally pooled model's weights all the same. Checkpoints written before a field was stored lack
        it: that field goes unchecked. Refused before anything in the run folder changes."""
        source = self.cfg.data.source
        was_data = stored.get("data", {}).get("source")
        if was_data is not None and not same_recorded_source(was_data, started_in, source):
            was_data = rooted(was_data, started_in)  # named as the run read it, in the folder it started in
            raise UserError(
                f"{path}: the run trained on --data {was_data}, this resume asks for {source}: a "
                f"checkpoint continues on its own data: expected --data {was_data}, or a new run"
            )
        self._refuse_other_copy(path, was)
        changes = []
        if "examples" in was and was["examples"] != self.meta["examples"]:
            changes.append(f"{was['examples']} -> {self.meta['examples']} examples in {source}")
        names_was, names_now = was.get("class_names"), self.meta["class_names"]
        # another class count is the weights' refusal (it names the counts and --num-classes, which sets an
        # array's names); the same count under other names is a class folder renamed (or one swapped for another)
        same_count = names_was is not None and len(names_was) == len(names_now)
        if same_count and names_was != names_now and not self._named_by_index_before(path, was, names_was):
            if set(names_was) != set(names_now):
                # a folder renamed (class0 -> zebra) shifts the indices of the classes between as well: by index it
                # read as every class moved, where one name came and one went
                changes.append(f"class names ({self._names_added_removed(names_was, names_now)})")
            else:  # the same names in another order
                moved = (f"{i}: {a!r} -> {b!r}" for i, (a, b) in enumerate(zip(names_was, names_now)) if a != b)
                changes.append(f"class names (index: then -> now) {first_five(moved)}")
        elif names_was is not None and len(names_was) != len(names_now) and not self._num_classes_typed(stored):
            # a class folder (or label) added or removed: said by name; the examples' count or the checksum alone
            # left the user to find which of many folders changed
            changes.append(self._classes_added_removed(names_was, names_now))
        if not changes and was.get("data_checksum") and was["data_checksum"] != self.meta["data_checksum"]:
            # rows reordered or files renamed under the same count: the seeded hold-out would draw other examples
            again = " was prepared again" if self.bundle.fingerprint_of == STORE_CHECKSUM else "'s content changed"
            changes.append(f"{source}{again} (its {self.bundle.fingerprint_of} differs)")
        if changes:
            raise UserError(
                f"{path}: the data changed since the checkpoint: {'; '.join(changes)}: a checkpoint continues on "
                "the data it trained on: expected that data as it was, or a new run (another --name, no --resume)"
            )
        was_shape, now_shape = was.get("image_shape"), self.meta["image_shape"]
        if was_shape is not None and list(was_shape) != now_shape:
            c, h, w = was_shape
            shown = "x".join(map(str, was_shape))
            same_channels_square = c == now_shape[0] and h == w
            fix = f"--image-size {h} (or none)" if same_channels_square else f"the run's own {shown} images"
            raise UserError(
                f"{path}: the run trained on {shown} images, this resume makes "
                f"{'x'.join(map(str, now_shape))}: a checkpoint continues at the image size it trained at: "
                f"expected {fix}, or a new run"
            )

    def _num_classes_typed(self, stored: dict) -> bool:
        """Whether --num-classes set the class count, now or in the checkpoint's run: another count is then the
        weights' refusal, which names --num-classes, not classes added to the data."""
        return bool(self.cfg.data.num_classes or stored.get("data", {}).get("num_classes"))

    @staticmethod
    def _classes_added_removed(names_was: list[str], names_now: list[str]) -> str:
        return (
            f"classes {len(names_was)} -> {len(names_now)} ({ResumeChecks._names_added_removed(names_was, names_now)})"
        )

    @staticmethod
    def _names_added_removed(names_was: list[str], names_now: list[str]) -> str:
        added = [n for n in names_now if n not in names_was]
        removed = [n for n in names_was if n not in names_now]
        said = [f"added {first_five(repr(n) for n in added)}"] if added else []
        said += [f"removed {first_five(repr(n) for n in removed)}"] if removed else []
        return "; ".join(said)

    def _named_by_index_before(self, path: Path, was: dict, names_was: list[str]) -> bool:
        """Whether the checkpoint's class names are only the indices its older cnnpar gave them: before 2026-12-03
        (dbe7474) cnnpar ignored an .npz's class_names and named the classes '0'..'N-1', so the archive's names in
        their order are the same classes. True (said in a note) where the data's checksum, stored since 12-04,
        confirms the arrays are the checkpoint's; a checksum that differs is the data's change, named by the
        caller; without one the resume is refused naming that cause, not a change of the data."""
        if self.bundle.fingerprint_of != ARRAYS_CHECKSUM or names_was != [str(i) for i in range(len(names_was))]:
            return False
        source, shown = self.cfg.data.source, first_five(repr(n) for n in self.meta["class_names"])
        if not was.get("data_checksum"):
            raise UserError(
                f"{path}: written by an older cnnpar that named the classes by index ({first_five(names_was)}) where "
                f"{source}'s class_names now name them ({shown}); it stores no checksum of its data to confirm "
                f"{source} is what it trained on: expected a new run (another --name, no --resume)"
            )
        if was["data_checksum"] != self.meta["data_checksum"]:
            return True  # the checksum's difference is the refusal's cause
        self.log(
            f"classes: the checkpoint predates {source}'s class_names: its cnnpar named the classes by "
            f"index ({first_five(names_was)}); its {self.bundle.fingerprint_of} matches, so they are {shown}, in "
            "the archive's order"
        )
        return True

    def _refuse_other_copy(self, path: Path, was: dict) -> None:
        """The typed --data may name other data than the checkpoint's (the same relative path typed in another
        folder): where the checkpoint's data is still where it was, this run's must hold the same files; where it
        is gone (moved), the count and class names checked next are all there is, and the run says so."""
        before, now = was.get("data_path"), self.meta["data_path"]
        if not before or not now or before == now:
            return
        checked = was.get("data_checksum") and was["data_checksum"] == self.meta["data_checksum"]
        if checked and self.bundle.fingerprint_of == STORE_CHECKSUM:
            self.log(f"data: the checkpoint's run read {before}; this resume reads {now}, the same store's pixels")
            return
        if not Path(before).exists():
            by = f"its {self.bundle.fingerprint_of}, " if was.get("data_checksum") else ""
            self.log(
                f"data: the checkpoint's run read {before}, which is gone; this resume reads {now}: compared by "
                f"{by}example count and class names only"
            )
            return
        differs = content_difference(Path(before), Path(now))
        if differs:
            raise UserError(
                f"{path}: the run trained on {before}; --data {self.cfg.data.source} here is {now}, other data "
                f"({differs}): a checkpoint continues on its own data: expected --data {before}, or a new run"
            )
        self.log(f"data: the checkpoint's run read {before}; this resume reads {now}, a copy with the same files")

    def refuse_changed_fields(self, path: Path, stored: dict) -> None:
        """A resumed run keeps the fields its checkpoint depends on: another --seed or --val-fraction would hold
        out other images, so validation would score images the finished epochs trained on; another --seed also
        draws other shuffles, crops and dropout (on synthetic data, other images), on data with its own split
        too; another --optimizer cannot take the checkpoint's optimizer state. Refused before anything in the run
        folder changes."""
        now = to_dict(self.cfg)
        # data with its own validation split (an npz's x_test, a folder's val/) ignores --val-fraction
        own_split = self.bundle.val_from not in (holdout_label(self.cfg.data.val_fraction), NO_HOLDOUT)
        for section, name, why in RESUME_FIXED:
            if name == "val_fraction" and own_split:
                continue
            was = stored.get(section, {}).get(name)
            if was is not None and was != now[section][name]:
                flag = "--" + name.replace("_", "-")
                raise UserError(
                    f"{path}: the run was started with {flag} {was}, this resume asks for {now[section][name]}: "
                    f"{why}: expected {flag} {was} (or none), or a new run"
                )
