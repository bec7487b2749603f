"""The epoch-end divergence check: a run whose training diverged stops before its checkpoint overwrites the last
good one, with one line that says what to try.

`DivergenceCheck` is mixed into the `Trainer` (engine/trainer.py), whose state it reads: the model and its weight
average, the precision (fp16's GradScaler), the epoch's last batch, the config as run and as asked, the history and
the run folder. Every command that trains epochs (train, bench's time to accuracy) asks here.
"""

from __future__ import annotations

import math

import torch

from cnnpar.config import asked_lr
from cnnpar.dist import all_reduce_sum
from cnnpar.engine.checkpoint import epochs_held
from cnnpar.engine.step import eval_batch
from cnnpar.errors import Diverged
from cnnpar.report.chance import at_chance_level


class DivergenceCheck:
    def check_diverged(self, epoch: int, row: dict, finish_first: bool = False) -> None:
        """Stop a run whose training diverged, before its checkpoint overwrites the last good one (the epochs
        already finished stay in the run folder): every command that trains epochs (train, bench's time to
        accuracy) asks here. A step's loss is read before its update, so the state the epoch ends on is checked
        too: its weights and buffers and, where no evaluation scored the live weights (an epoch not evaluated, or
        evaluated on the weight average), the outputs on its last batch (weights of 1e28 are finite, their logits
        are not). fp16 is the exception while the weights and buffers stay finite: its GradScaler skips
        overflowing steps on purpose (their losses are inf/nan), and logits past fp16's 65,504 overflow in
        evaluation too, where an fp32 run of the same weights trains on; there a non-finite loss only warns, but
        for the run's last epoch where the weights it ends on score no finite loss either (`_overflowed_to_the_end`).
        `finish_first`: that last case is kept in `ended_overflowing` for the caller to raise once the epoch's
        checkpoint and the run's records are written (train: its weights are finite, as fp16 keeps them)."""
        scored_live = "val_loss" in row and (self.average is None or not self.average.started)
        state_ok, outputs, every_largest, own_largest = self._state_finite(probe=not scored_live)
        fp16 = self.precision.scaler is not None
        losses = [("train loss", row["train_loss"]), ("val loss", row.get("val_loss", 0.0))]
        bad = [(what, value) for what, value in losses if not math.isfinite(value)]
        if bad and (not fp16 or not state_ok):
            what, value = bad[0]
            # under fp16 the loss alone would have warned: a forward that overflowed wrote inf/nan into BatchNorm's
            # statistics, which no skipped step undoes
            text = f"{what} {value} is not finite and neither are the weights or buffers" if fp16 else ""
            self._diverged(epoch, what, value, text)
        if not state_ok:
            self._diverged(epoch, "weights", every_largest, "the weights or buffers are not finite")  # some rank's
        if not math.isfinite(outputs):
            if not fp16:
                text = (
                    f"after its last update the loss on its last batch is {outputs} (the largest weight is "
                    f"{own_largest:.3g})"
                )
                self._diverged(epoch, "outputs", outputs, text)
            bad.append(("loss on its last batch", outputs))
        if bad and self._overflowed_to_the_end(epoch, row, outputs):
            said = ", ".join(f"{what} {value}" for what, value in bad)
            text = (
                f"{said} at the run's end (fp16 overflows: the GradScaler skipped {self.precision.skipped_steps} "
                "steps; the weights and buffers are finite)"
            )
            self.ended_overflowing = (epoch, bad[0][0], bad[0][1], text)
            if not finish_first:
                self._diverged(*self.ended_overflowing)
            return
        if bad:
            said = ", ".join(f"{what} {value}" for what, value in bad)
            self.log(
                f"warning: epoch {epoch}: {said} (fp16 overflows; the GradScaler skipped "
                f"{self.precision.skipped_steps} steps so far; the weights and buffers are finite); if it stays so, "
                f"try --precision bf16 or {self._half_the_lr()}"
            )

    def _overflowed_to_the_end(self, epoch: int, row: dict, outputs: float) -> bool:
        """Under fp16, with finite weights: the run's last epoch overflowed in training (its train loss is not finite)
        and the weights it ends on score no finite loss (validation, or the last batch without one). "If it stays so"
        no longer applies: the run's result would be that chance-level model, and it ends as a bf16 divergence does.
        A single overflowing step also makes the epoch's mean train loss inf: a finite score keeps that a warning. So
        does one validation sample whose outputs pass fp16's range (an inf val loss) beside an accuracy above chance
        (report.chance): the model learned, and only its loss could not be summed."""
        score = row["val_loss"] if "val_loss" in row else outputs
        overflowed = epoch == self.cfg.run.epochs and not math.isfinite(row["train_loss"]) and not math.isfinite(score)
        learned = "val_acc" in row and not at_chance_level(row["val_acc"], self.bundle.num_classes)
        return overflowed and not learned

    def _state_finite(self, probe: bool) -> tuple[bool, float, float, float]:
        """(whether every rank's weights and floating buffers are finite, the loss on the epoch's last batch in eval
        mode where `probe` (else 0) summed over the ranks, the ranks' largest magnitudes summed (inf or nan where
        any is), this rank's largest magnitude): every rank stops alike (BatchNorm buffers differ by rank). The
        largest magnitude, not a norm: a norm of finite weights of 1e20 overflows. Note: a CPU-GPU sync point, once
        an epoch."""
        models = [self.raw_model]
        if self.average is not None and self.average.started:  # before it starts, eval_model() is raw_model again
            models.append(self.average.eval_model())
        tensors = [
            t.detach() for m in models for t in (*m.parameters(), *m.buffers()) if t.is_floating_point() and t.numel()
        ]  # _foreach_norm's inf-norm refuses an empty tensor
        largest = torch.stack([n.double() for n in torch._foreach_norm(tensors, float("inf"))]).max()
        loss = torch.zeros((), dtype=torch.float64, device=self.info.device)
        if probe and self.last_batch is not None:
            self.raw_model.eval()  # BatchNorm's running statistics, as predict and evaluation use them
            with torch.no_grad():
                loss = eval_batch(self.raw_model, *self.last_batch, self.precision)[0]
            self.raw_model.train()
        largest = largest.to(loss.device)
        sums = all_reduce_sum(torch.stack([largest, loss]), self.info)  # inf and nan survive a sum
        every_largest, outputs, own_largest = torch.cat([sums, largest[None]]).tolist()
        return math.isfinite(every_largest), outputs, every_largest, own_largest

    def _half_the_lr(self) -> str:
        """Half the --lr the user gave (or the optimizer's default, for --lr auto), in the flag's own terms: the lr
        that trained may be that one scaled to a searched batch or the world size (call ZZZZR: --lr 5 trained at 10
        and was told to try --lr 5)."""
        return f"--lr {asked_lr(self.requested_cfg.optim) / 2:g}"

    def _diverged(self, epoch: int, what: str, value: float, text: str = "") -> None:
        """Raise the one-line error; `what` and `value` are Diverged's fields, `text` what the line says of them."""
        text = text or f"{what} {value} is not finite"
        kept = ""
        if self.history:  # "epoch 1 is kept", as the other lines that say what is kept word it, not "epochs 1-1"
            last = self.history[-1]["epoch"]
            kept = f" ({epochs_held(last)} {'is' if last == 1 else 'are'} kept in {self.run_dir})"
        # only what would change something: a run in fp32 and not compiled is told only of its lr
        advice = [f"a lower lr ({self._half_the_lr()})"]
        if self.cfg.speed.precision != "fp32":
            advice.append("--precision fp32")
        if self.cfg.speed.compile != "off":
            advice.append("--compile off")
        advice = ", ".join(advice[:-1]) + " or " + advice[-1] if len(advice) > 1 else advice[0]
        raise Diverged(
            f"epoch {epoch}: {text}, training diverged{kept}: try {advice}",
            epoch,
            what,
            value,
        )
