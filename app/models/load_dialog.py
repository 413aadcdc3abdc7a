"""The dialog shown before a model loads: options and the memory estimate (GUI thread).

It asks the engine to inspect the model (``InspectModel``; the engine thread reads
the file headers, the GUI never imports torch) and shows, for the chosen
precision, the weights plus the KV cache for the chosen context length against
the free GPU and system memory, with a verdict: fits, tight or won't fit.
The engine proposes the context (what fits, up to 32 768 tokens) and says why under
the box. The KV cache may be bf16 or int8 (half the memory, so about twice the context; the
CPU only). Changing the device, the context length or the KV cache asks again (debounced);
changing the precision only redraws. "Load" is refused while the choice cannot fit. The draft
model (none, the built-in one, or a model file) is the caller's to remember per model: the
dialog opens on the one it is given. Choosing one asks again: the engine counts its weights and its
KV pool beside the model, in the total and the verdict, and the dialog shows its part on a row of its own.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QRect, Qt, QTimer
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.controller import EngineController
from app.perf.format import format_bytes, format_count
from engine.protocol.messages import InspectFailed, LoadOptions, ModelInspected, PrecisionEstimate

DEVICES = (("Auto", "auto"), ("CUDA", "cuda"), ("CPU", "cpu"))
PRECISIONS = (
    ("Auto", "auto"), ("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32"), ("8-bit", "int8"), ("4-bit", "int4"),
)
PRECISION_WORDS = {value: text for text, value in PRECISIONS}
KV_CACHES = (("bf16", "auto"), ("int8 (half the memory)", "int8"))  # auto: bf16 on the CPU, the compute dtype on a GPU
DRAFT_CHOICES = (("None", ""), ("The built-in model (SmolLM2-135M)", "default"), ("A model file…", "pick"))
"""The draft model box's entries: "" for none, "pick" asks for a file (then listed by its name, the path its data)."""
DRAFT_TIP = ("A small model with the same tokenizer drafts a few tokens ahead and this model checks them in one "
             "step: replies read the same, sooner when the drafts are right. One with another tokenizer is not used; "
             "the load says so.")
GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
MIN_CONTEXT = 256
MAX_CONTEXT = 1 << 20
REINSPECT_DELAY_MS = 300
LONGEST_REASON = "1 048 576 of 1 048 576 tokens: the default for chat, which fits in 1024.00 GiB free"
"""The longest reason for a context the engine writes (``context_choice.ContextChoice.reason``), at its widest
figures: the reason's label keeps its height at its width, whatever it says, so the rows below stay put."""
VERDICT_TEXT = {"fits": "Fits", "tight": "Tight", "won't fit": "Won't fit"}
ADVICE = {
    "fits": "Uses {share:.0%} of the free {memory}.",
    "tight": "Uses {share:.0%} of the free {memory}: it should load, but leaves little for other programs.",
    "won't fit": "Needs {missing} more than the free {memory}. Pick a smaller precision{or_draft}.",
}
SHORTER = {False: " or a shorter context", True: ", a shorter context or no draft model"}  # with a draft model?
VERDICT_COLOUR = {"fits": "#2e7d32", "tight": "#b26a00", "won't fit": "#b3261e"}
KIND_WORDS = {"gguf": "GGUF file", "hf_folder": "Hugging Face folder"}


def describe_model(found: ModelInspected) -> str:
    millions = found.n_params / 1e6
    size = f"{millions / 1000:.1f} B" if millions >= 1000 else f"{millions:.0f} M"
    kind = KIND_WORDS.get(found.kind, found.kind)
    kind = f"{kind} ({found.file_type})" if found.file_type else kind
    return f"{kind} · {size} parameters · trained for {format_count(found.native_context_length)} tokens"


def unavailable_reason(text: str, found: ModelInspected) -> str:
    """Why the precision the box words as ``text`` cannot be chosen for ``found`` (the engine gave no estimate for
    it)."""
    return f"{text} is not offered for this model on the {found.device.upper()}."


def free_memory_text(found: ModelInspected) -> tuple[str, str]:
    """(free GPU memory, free system memory) as the dialog words them."""
    gpu = format_bytes(found.available_bytes_cuda) if found.cuda_available else "no CUDA GPU"
    return gpu, format_bytes(found.available_bytes_cpu)


def advice(found: ModelInspected, shown: PrecisionEstimate) -> str:
    """One sentence under the verdict: how much of the free memory the model takes, or lacks."""
    free = found.available_bytes_cuda if found.device == "cuda" else found.available_bytes_cpu
    memory = "GPU memory" if found.device == "cuda" else "system memory"
    share = shown.total_bytes / max(free, 1)
    missing = format_bytes(max(shown.total_bytes - free, 0))
    or_draft = SHORTER[draft_bytes(found) > 0]
    return ADVICE[shown.verdict].format(share=share, memory=memory, missing=missing, or_draft=or_draft)


def draft_bytes(found: ModelInspected) -> int:
    """What the chosen draft model holds beside the model (weights and KV pool); 0 without one."""
    return found.draft_weight_bytes + found.draft_kv_bytes


class ReasonLabel(QLabel):
    """The context's reason under its box: wraps, and keeps the height ``LONGEST_REASON`` takes at its width."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__("", parent)
        self.setWordWrap(True)
        self.setStyleSheet("color: #6b6259;")

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        room = QRect(0, 0, event.size().width(), 1 << 20)
        self.setMinimumHeight(self.fontMetrics().boundingRect(room, Qt.TextFlag.TextWordWrap, LONGEST_REASON).height())


class LoadDialog(QDialog):
    """Options for loading ``path``; ``options()`` gives them once accepted."""

    def __init__(self, controller: EngineController, path: str, parent: QWidget | None = None,
                 draft_model: str | None = None) -> None:
        """``draft_model``: the draft model shown chosen ("default", a path; None for none)."""
        super().__init__(parent)
        self.setObjectName("loadDialog")
        self.setWindowTitle("Open model")
        self.setMinimumWidth(460)
        self._controller = controller
        self._path = path
        self._found: ModelInspected | None = None
        self._pending_request = ""
        self._reinspect_timer = QTimer(self, singleShot=True, interval=REINSPECT_DELAY_MS)
        self._reinspect_timer.timeout.connect(self._inspect)
        self._draft_model = draft_model
        self._context_edited = False
        self._build()
        controller.model_inspected.connect(self._on_inspected)
        controller.inspect_failed.connect(self._on_inspect_failed)
        self._inspect()

    @property
    def inspected(self) -> ModelInspected | None:
        """The engine's latest answer for the options shown, if any."""
        return self._found

    def options(self) -> LoadOptions:
        """What the user chose; the context only where they set it (else the engine chooses it, and says why)."""
        context = self.context_box.value() if self.context_box.isEnabled() and self._context_edited else None
        return LoadOptions(self.device_box.currentData(), self.precision_box.currentData(), context,
                           kv_cache=self.kv_cache_box.currentData(), draft_model=self._draft_model)

    def chosen_estimate(self) -> PrecisionEstimate | None:
        if self._found is None:
            return None
        precision = self.precision_box.currentData()
        if precision == "auto":
            precision = self._found.auto_precision
        return next((item for item in self._found.estimates if item.precision == precision), None)

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        self.name_label = QLabel(self._path, self, objectName="loadDialogName")
        self.name_label.setStyleSheet("font-size: 15px; font-weight: bold;")
        self.path_label = self._wrapping_label(self._path, "color: #6b6259;")
        self.path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.summary_label = self._wrapping_label("Reading the model's headers…", "")
        for widget in (self.name_label, self.path_label, self.summary_label):
            layout.addWidget(widget)
        layout.addLayout(self._build_options())
        layout.addWidget(self._build_estimate())
        self.message_label = self._wrapping_label("", "color: #b3261e;")
        self.message_label.setObjectName("loadDialogMessage")
        self.message_label.hide()
        layout.addWidget(self.message_label)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel, self)
        self.load_button = self.buttons.addButton("Load", QDialogButtonBox.ButtonRole.AcceptRole)
        self.load_button.setDefault(True)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)

    def _wrapping_label(self, text: str, style: str) -> QLabel:
        label = QLabel(text, self)
        label.setWordWrap(True)
        label.setStyleSheet(style)
        return label

    def _build_options(self) -> QFormLayout:
        form = QFormLayout()
        self.device_box = self._combo(DEVICES, "Device")
        self._set_item_enabled(self.device_box, "cuda", False)
        self.precision_box = self._combo(PRECISIONS, "Precision")
        self.kv_cache_box = self._combo(KV_CACHES, "KV cache")
        self.kv_cache_box.setToolTip("int8 keeps a code a value and a scale per 32, as llama.cpp's q8_0 cache: half "
                                     "bf16's memory, so about twice the context fits. The CPU only.")
        self.context_box = QSpinBox(self, minimum=MIN_CONTEXT, maximum=MAX_CONTEXT, singleStep=1024, suffix=" tokens")
        self.context_box.setAccessibleName("Context length")
        self.context_box.setGroupSeparatorShown(True)
        self.context_box.setEnabled(False)
        form.addRow("Device", self.device_box)
        form.addRow("Precision", self.precision_box)
        form.addRow("Context length", self.context_box)
        form.addRow("KV cache", self.kv_cache_box)
        self.context_reason_label = ReasonLabel(self)
        self.context_reason_label.setObjectName("loadDialogContextReason")
        form.addRow("", self.context_reason_label)
        self.draft_box = self._combo(DRAFT_CHOICES, "Draft model")
        self.draft_box.setToolTip(DRAFT_TIP)
        self._show_draft(self._draft_model)
        self.draft_box.activated.connect(self._on_draft_chosen)
        form.addRow("Draft model", self.draft_box)
        self.device_box.currentIndexChanged.connect(self._reinspect_timer.start)
        self.context_box.valueChanged.connect(self._on_context_edited)
        self.kv_cache_box.currentIndexChanged.connect(self._reinspect_timer.start)
        self.precision_box.currentIndexChanged.connect(self._show_estimate)
        return form

    def _show_draft(self, draft_model: str | None) -> None:
        """Show ``draft_model`` chosen (a file not listed yet is listed by its name) and take it."""
        self._draft_model = draft_model
        index = self.draft_box.findData(draft_model or "")
        if index < 0:
            index = self.draft_box.count() - 1  # before "A model file…"
            self.draft_box.insertItem(index, Path(draft_model).name, draft_model)
            self.draft_box.setItemData(index, draft_model, Qt.ItemDataRole.ToolTipRole)
        self.draft_box.setCurrentIndex(index)

    def _on_draft_chosen(self, index: int) -> None:
        """The user chose an entry: "A model file…" asks for the file (cancelled: the choice before stays)."""
        chosen = self.draft_box.itemData(index)
        if chosen != "pick":
            self._draft_model = chosen or None
        else:
            path, _filter = QFileDialog.getOpenFileName(self, "Choose a draft model", str(Path(self._path).parent),
                                                        GGUF_FILTER)
            self._show_draft(path or self._draft_model)
        self._reinspect_timer.start()  # the estimate counts the draft model

    def _combo(self, items: tuple[tuple[str, str], ...], name: str) -> QComboBox:
        box = QComboBox(self)
        box.setAccessibleName(name)
        for text, value in items:
            box.addItem(text, value)
        return box

    def _build_estimate(self) -> QGroupBox:
        group = QGroupBox("Memory estimate", self)
        form = self._estimate_form = QFormLayout(group)
        self.estimate_labels: dict[str, QLabel] = {}
        for key in ("weights", "kv", "draft", "total", "free_gpu", "free_cpu"):
            label = QLabel("…", group, objectName=f"estimate_{key}")
            label.setAlignment(Qt.AlignmentFlag.AlignRight)
            self.estimate_labels[key] = label
            form.addRow(QLabel("", group, objectName=f"estimate_{key}_name"), label)
        self.verdict_label = QLabel("Estimating…", group, objectName="loadDialogVerdict")
        self.advice_label = self._wrapping_label("", "")
        form.addRow(self.verdict_label)
        form.addRow(self.advice_label)
        return group

    @staticmethod
    def _set_item_enabled(box: QComboBox, value: str, enabled: bool, why_not: str = "") -> None:
        """Enable ``value``'s entry; a disabled one says ``why_not`` in its tooltip."""
        item = box.model().item(box.findData(value))
        item.setEnabled(enabled)
        item.setToolTip("" if enabled else why_not)

    def _on_context_edited(self) -> None:
        """The user set the context: from now on the estimates are for it (the engine's answers set the box with its
        signals blocked)."""
        self._context_edited = True
        self._reinspect_timer.start()

    def _inspect(self) -> None:
        """Ask the engine for its estimate of the options shown; the context its own choice until the user sets one,
        so that a change of device, KV cache or draft model chooses it anew."""
        options = LoadOptions(self.device_box.currentData(), "auto", self.options().context_length,
                              self.kv_cache_box.currentData(), self._draft_model)
        self._pending_request = self._controller.inspect_model(self._path, options)

    def _on_inspected(self, found: ModelInspected) -> None:
        if found.request_id != self._pending_request:
            return
        self._found = found
        self.name_label.setText(found.name)
        self.summary_label.setText(describe_model(found))
        self._set_item_enabled(self.device_box, "cuda", found.cuda_available, "No CUDA GPU was found on this computer.")
        estimated = {item.precision for item in found.estimates}
        for text, value in PRECISIONS[1:]:
            self._set_item_enabled(self.precision_box, value, value in estimated, unavailable_reason(text, found))
        if self.precision_box.currentData() not in estimated:
            self.precision_box.setCurrentIndex(0)  # a precision this model or device does not offer
        auto = PRECISION_WORDS.get(found.auto_precision, found.auto_precision) if found.auto_precision else "none fits"
        self.precision_box.setItemText(0, f"Auto ({auto} on {found.device.upper()})")
        self._show_context(found)
        self._show_notes(found.notes)
        self._show_estimate()

    def _show_context(self, found: ModelInspected) -> None:
        self.context_box.blockSignals(True)
        self.context_box.setMaximum(max(found.native_context_length, MIN_CONTEXT))
        self.context_box.setValue(found.context_length)
        self.context_box.setEnabled(True)
        self.context_box.blockSignals(False)
        self.context_reason_label.setText(found.context_reason)

    def _show_notes(self, notes: tuple[str, ...]) -> None:
        self.message_label.setStyleSheet("color: #6b6259; font-style: italic;")
        self.message_label.setText("\n".join(notes))
        self.message_label.setVisible(bool(notes))

    def _on_inspect_failed(self, failed: InspectFailed) -> None:
        if failed.request_id != self._pending_request:
            return
        self._found = None
        self.summary_label.setText("Hearth cannot load this model.")
        self.message_label.setStyleSheet("color: #b3261e;")
        self.message_label.setText(failed.message)
        self.message_label.show()
        self.verdict_label.setText("")
        self.advice_label.setText("")
        self.load_button.setEnabled(False)

    def _show_estimate(self) -> None:
        found, chosen = self._found, self.chosen_estimate()
        if found is None:
            return
        shown = chosen or found.estimates[-1]  # auto with nothing fitting: the smallest precision
        for key, (name, value) in self._estimate_rows(found, shown).items():
            self.findChild(QLabel, f"estimate_{key}_name").setText(name)
            self.estimate_labels[key].setText(value)
        self._estimate_form.setRowVisible(self.estimate_labels["draft"], draft_bytes(found) > 0)
        self.verdict_label.setText(VERDICT_TEXT[shown.verdict])
        self.verdict_label.setStyleSheet(f"font-weight: bold; font-size: 14px; color: {VERDICT_COLOUR[shown.verdict]};")
        self.advice_label.setText(advice(found, shown))
        self.load_button.setEnabled(shown.verdict != "won't fit")
        self.adjustSize()  # the advice may take another line

    @staticmethod
    def _estimate_rows(found: ModelInspected, shown: PrecisionEstimate) -> dict[str, tuple[str, str]]:
        free_gpu, free_cpu = free_memory_text(found)
        device = "GPU" if found.device == "cuda" else "system memory"
        draft = f"+ {format_bytes(draft_bytes(found))}"
        experts = f", {found.expert_format} experts" if found.expert_format else ""
        return {
            "weights": (f"Weights ({shown.precision}{experts})", format_bytes(shown.weight_bytes)),
            "kv": (f"KV cache ({format_count(found.context_length)} tokens)", format_bytes(shown.kv_bytes)),
            "draft": ("Draft model (weights + KV cache)", draft),
            "total": (f"Needed in {device}, with overhead{' and draft model' if draft_bytes(found) else ''}",
                      format_bytes(shown.total_bytes)),
            "free_gpu": ("Free GPU memory", free_gpu),
            "free_cpu": ("Free system memory", free_cpu),
        }
