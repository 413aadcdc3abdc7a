"""The sampling controls shared by both settings dialogs (GUI thread).

One labelled, accessibly named spin box per ``SamplingSettings`` numeric field; the seed
box's lowest value means "random" (no seed); a check box for speculative drafting.
"""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QFormLayout, QSpinBox, QWidget

from app.storage import SamplingSettings

RANDOM_SEED_TEXT = "random"
_FLOATS = (
    ("temperature", "&Temperature", 0.0, 2.0, 0.05, "0 always picks the most likely token"),
    ("top_p", "Top-&p", 0.0, 1.0, 0.01, "keep the most likely tokens up to this total probability"),
    ("min_p", "M&in-p", 0.0, 1.0, 0.01, "drop tokens less likely than this share of the best one"),
    ("repetition_penalty", "&Repetition penalty", 1.0, 2.0, 0.05, "1 means no penalty"),
)
_INTS = (
    ("top_k", "Top-&k", 0, 1000, "0 means no limit"),
    ("max_new_tokens", "&Max tokens", 1, 32768, "the longest reply, in tokens"),
)


class SamplingForm(QWidget):
    """Edits a ``SamplingSettings``: ``set_values`` fills it, ``values`` reads it back."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QFormLayout(self)
        self._floats: dict[str, QDoubleSpinBox] = {}
        self._ints: dict[str, QSpinBox] = {}
        for name, label, low, high, step, help_text in _FLOATS:
            box = QDoubleSpinBox(self)
            box.setRange(low, high)
            box.setSingleStep(step)
            box.setDecimals(2)
            self._floats[name] = self._add(layout, box, label, help_text)
        for name, label, low, high, help_text in _INTS:
            self._ints[name] = self._add(layout, QSpinBox(self), label, help_text)
            self._ints[name].setRange(low, high)
        self.seed_box = self._add(layout, QSpinBox(self), "&Seed", "the same seed gives the same reply")
        self.seed_box.setRange(-1, 2**31 - 1)
        self.seed_box.setSpecialValueText(RANDOM_SEED_TEXT)
        self.drafts_box = self._add(layout, QCheckBox(self), "&Draft ahead",
                                    "guess the next tokens from the conversation and check them in one step: replies "
                                    "that repeat its text come faster; what the model says is unchanged")
        self.set_values(SamplingSettings())

    def set_values(self, sampling: SamplingSettings) -> None:
        for name, box in self._floats.items():
            box.setValue(getattr(sampling, name))
        for name, box in self._ints.items():
            box.setValue(getattr(sampling, name))
        self.seed_box.setValue(-1 if sampling.seed is None else sampling.seed)
        self.drafts_box.setChecked(sampling.speculative)

    def values(self) -> SamplingSettings:
        numbers = {name: box.value() for name, box in self._floats.items()}
        numbers.update({name: box.value() for name, box in self._ints.items()})
        seed = self.seed_box.value()
        return SamplingSettings(**numbers, seed=None if seed < 0 else seed, speculative=self.drafts_box.isChecked())

    def box(self, name: str) -> QDoubleSpinBox | QSpinBox:
        """The control for the field ``name`` (e.g. "temperature", "seed")."""
        return self.seed_box if name == "seed" else self._floats.get(name) or self._ints[name]

    def _add(self, layout: QFormLayout, box, label: str, help_text: str):
        box.setAccessibleName(label.replace("&", ""))
        box.setAccessibleDescription(help_text)
        box.setToolTip(help_text)
        layout.addRow(label, box)
        return box
