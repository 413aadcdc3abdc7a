"""Picking a model: Ctrl+O, a drop on the window, Recent models, and the load dialog's estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel

from app.controller import EngineController
from app.models import load_dialog
from app.models.load_dialog import LoadDialog
from app.models.recent_models import RecentModelsMenu
from app.storage import load_settings
from app.window.main_window import MainWindow
from engine.protocol import messages
from engine.protocol.messages import LoadOptions

GIB = 1024**3


@pytest.fixture
def hearth_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny-chat.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF")
    return path


def _model_action(window: MainWindow, text: str):
    menu = next(action.menu() for action in window.menuBar().actions() if action.text() == "&File")
    return next(action for action in menu.actions() if action.text() == text)


def _open_load_dialog(qtbot, window: MainWindow) -> LoadDialog:
    qtbot.waitUntil(lambda: any(d.isVisible() for d in window.findChildren(LoadDialog)), timeout=5000)
    dialog = next(d for d in window.findChildren(LoadDialog) if d.isVisible())
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)
    return dialog


def _wait_for_model(qtbot, window: MainWindow, name: str) -> None:
    qtbot.waitUntil(lambda: window.status_line.state_label.text().startswith(f"Ready: {name}"), timeout=5000)


def test_ctrl_o_opens_a_gguf_through_the_load_dialog_with_the_chosen_options(
    qtbot, chat, window, script, gguf_file, monkeypatch
):
    chat.wait_until_ready()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args, **kwargs: (str(gguf_file), ""))
    action = _model_action(window, "&Open model file…")
    assert action.shortcut() == QKeySequence("Ctrl+O")

    action.trigger()
    dialog = _open_load_dialog(qtbot, window)
    dialog.precision_box.setCurrentIndex(dialog.precision_box.findData("bf16"))
    dialog.context_box.setValue(2048)
    qtbot.waitUntil(lambda: dialog.inspected.context_length == 2048, timeout=5000)
    assert script.inspections[-1].options.context_length == 2048  # the user's, from now on
    qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)

    _wait_for_model(qtbot, window, "Fake tiny-chat.gguf")
    assert script.loads[-1].path == str(gguf_file)
    assert script.loads[-1].options == LoadOptions(device="auto", precision="bf16", context_length=2048)


def test_the_load_dialogs_int8_kv_cache_is_estimated_and_loaded(qtbot, chat, window, script, gguf_file):
    """Choosing the int8 KV cache asks the engine for its estimate again, and the load takes it."""
    chat.wait_until_ready()
    dialog = window.model_loader.choose(str(gguf_file))
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)
    assert script.inspections[-1].options.kv_cache == "auto"
    assert dialog.kv_cache_box.currentText() == "bf16"

    dialog.kv_cache_box.setCurrentIndex(dialog.kv_cache_box.findData("int8"))
    assert dialog.kv_cache_box.currentText() == "int8 (half the memory)"
    qtbot.waitUntil(lambda: script.inspections[-1].options.kv_cache == "int8", timeout=5000)
    assert script.inspections[-1].options.context_length is None  # the engine chooses it anew for int8
    qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)

    _wait_for_model(qtbot, window, "Fake tiny-chat.gguf")
    assert script.loads[-1].options.kv_cache == "int8"
    assert script.loads[-1].options.context_length is None  # not "as asked": the user never set it


def test_a_gguf_dropped_on_the_window_opens_the_load_dialog(qtbot, chat, window, script, gguf_file):
    chat.wait_until_ready()
    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(str(gguf_file))])
    enter = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, data, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, enter)
    assert enter.isAccepted()

    drop = QDropEvent(QPoint(10, 10), Qt.DropAction.CopyAction, data, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, drop)
    dialog = _open_load_dialog(qtbot, window)
    assert script.inspections[-1].path == str(gguf_file)
    dialog.accept()

    _wait_for_model(qtbot, window, "Fake tiny-chat.gguf")
    assert script.loads[-1].options == LoadOptions(device="auto", precision="auto")  # the engine chooses the context


def test_a_dropped_text_file_is_not_taken_for_a_model(window, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(str(notes))])
    enter = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, data, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    enter.ignore()
    QApplication.sendEvent(window, enter)

    assert not enter.isAccepted()


def _start_window(qtbot, factory) -> tuple[MainWindow, EngineController]:
    controller = EngineController()
    window = MainWindow(controller)
    qtbot.addWidget(window)
    window.show()
    controller.start(factory())
    return window, controller


def _recent_paths(menu: RecentModelsMenu) -> list[str]:
    menu.rebuild()
    return [action.data() for action in menu.actions() if action.data()]


def test_recent_models_lists_loaded_models_across_restarts(
    hearth_home, qtbot, qasync_loop, fake_engine_factory, script
):
    first, controller = _start_window(qtbot, fake_engine_factory)
    assert _recent_paths(first.model_loader.recent_menu) == []
    first.model_loader.load("/models/one.gguf")
    _wait_for_model(qtbot, first, "Fake one.gguf")
    first.model_loader.load(script.broken_path)
    qtbot.waitUntil(lambda: not first.model_loader.progress.isVisible(), timeout=5000)
    first.model_loader.load("/models/two")
    _wait_for_model(qtbot, first, "Fake two")
    first.settings_holder.update(theme="dark")  # another setting saved after them keeps them
    controller.close()

    second, controller = _start_window(qtbot, fake_engine_factory)
    assert _recent_paths(second.model_loader.recent_menu) == ["/models/two", "/models/one.gguf"]
    second.model_loader.recent_menu.actions()[1].trigger()
    dialog = _open_load_dialog(qtbot, second)
    assert script.inspections[-1].path == "/models/one.gguf"
    dialog.reject()
    controller.close()


def test_the_load_dialog_shows_the_verdict_and_what_auto_picks(qtbot, chat, window, script):
    script.free_cpu_bytes = int(2.5 * GIB)  # fp32 (2.25 GiB) is tight, bf16 (1.1 GiB) fits
    chat.wait_until_ready()
    dialog = window.model_loader.choose("/models/big.gguf")
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)

    assert dialog.precision_box.currentText() == "Auto (bf16 on CPU)"
    assert "(Q4_K_M)" in dialog.summary_label.text(), "the file's quantization is named"
    assert dialog.context_box.value() == 4096
    assert dialog.context_reason_label.text() == "4 096 tokens: the model's full context"
    assert dialog.verdict_label.text() == "Fits"
    assert dialog.estimate_labels["weights"].text() == "1.00 GiB"
    assert dialog.estimate_labels["free_cpu"].text() == "2.50 GiB"
    assert dialog.estimate_labels["free_gpu"].text() == "no CUDA GPU"
    assert not dialog.device_box.model().item(dialog.device_box.findData("cuda")).isEnabled()
    eight_bit = dialog.precision_box.model().item(dialog.precision_box.findData("int8"))
    assert not eight_bit.isEnabled()
    assert eight_bit.toolTip() == "8-bit is not offered for this model on the CPU.", "a greyed-out choice says why"
    assert dialog.precision_box.model().item(dialog.precision_box.findData("int4")).isEnabled()

    dialog.precision_box.setCurrentIndex(dialog.precision_box.findData("fp32"))
    assert dialog.verdict_label.text().startswith("Tight")
    assert dialog.load_button.isEnabled()


def test_the_load_dialog_refuses_a_model_that_cannot_fit(qtbot, chat, window, script):
    script.free_cpu_bytes = GIB // 4
    chat.wait_until_ready()
    dialog = window.model_loader.choose("/models/huge.gguf")
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)

    assert dialog.precision_box.currentText() == "Auto (none fits on CPU)"
    assert dialog.verdict_label.text().startswith("Won't fit")
    assert not dialog.load_button.isEnabled()

    dialog.context_box.setValue(512)  # shorter context, smaller KV cache: still too big, even in 4 bits
    qtbot.waitUntil(lambda: dialog.inspected.context_length == 512, timeout=5000)
    assert dialog.estimate_labels["kv"].text() == "16.0 MiB"
    assert not dialog.load_button.isEnabled()


def _choose_draft(dialog: LoadDialog, value: str) -> None:
    dialog.draft_box.setCurrentIndex(dialog.draft_box.findData(value))
    dialog.draft_box.activated.emit(dialog.draft_box.currentIndex())


def test_the_load_dialog_counts_the_chosen_draft_model_and_refuses_what_fits_only_without_it(
    qtbot, chat, window, script
):
    script.free_cpu_bytes = int(2.5 * GIB)  # fp32 (2.25 GiB) is tight alone
    chat.wait_until_ready()
    dialog = window.model_loader.choose("/models/big.gguf")
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)
    dialog.precision_box.setCurrentIndex(dialog.precision_box.findData("fp32"))
    assert dialog.verdict_label.text().startswith("Tight")
    assert dialog.estimate_labels["draft"].isHidden()

    _choose_draft(dialog, "default")  # its weights and KV pool: 0.375 GiB more
    qtbot.waitUntil(lambda: dialog.inspected.draft_weight_bytes > 0, timeout=5000)
    assert script.inspections[-1].options.draft_model == "default"
    assert not dialog.estimate_labels["draft"].isHidden()
    assert dialog.estimate_labels["draft"].text() == "+ 384 MiB"
    assert dialog.findChild(QLabel, "estimate_total_name").text().endswith("with overhead and draft model")
    assert dialog.estimate_labels["total"].text() == "2.62 GiB"
    assert dialog.verdict_label.text().startswith("Won't fit")
    assert "no draft model" in dialog.advice_label.text()
    assert not dialog.load_button.isEnabled()

    _choose_draft(dialog, "")
    qtbot.waitUntil(lambda: dialog.inspected.draft_weight_bytes == 0, timeout=5000)
    assert dialog.verdict_label.text().startswith("Tight") and dialog.load_button.isEnabled()
    assert dialog.estimate_labels["draft"].isHidden()
    dialog.reject()


def test_the_rows_under_the_context_reason_stay_put_as_the_reason_changes(qtbot, chat, window, script):
    script.context_reason = "4 096 tokens, as asked"
    chat.wait_until_ready()
    dialog = window.model_loader.choose("/models/big.gguf")
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)
    dialog.show()
    below = (dialog.draft_box, dialog.verdict_label, dialog.load_button)

    def rows_after(reason: str) -> list[int]:
        """Where the rows below the reason lie once the engine's next answer gives ``reason``."""
        script.context_reason = reason
        dialog.kv_cache_box.setCurrentIndex(1 - dialog.kv_cache_box.currentIndex())  # asks the engine again
        qtbot.waitUntil(lambda: dialog.context_reason_label.text() == reason, timeout=5000)
        QApplication.processEvents()
        return [widget.mapTo(dialog, QPoint(0, 0)).y() for widget in below]

    short = rows_after("4 096 tokens: the model's full context")
    assert rows_after("32 768 of 131 072 tokens: the default for chat, which fits in 120.00 GiB free") == short
    assert rows_after("") == short  # nothing fits: no reason
    assert rows_after("4 096 tokens, as asked") == short
    dialog.reject()


def test_the_load_dialog_explains_a_refused_path_and_does_not_load(qtbot, chat, window, script):
    chat.wait_until_ready()
    dialog = window.model_loader.choose(script.broken_path)
    qtbot.waitUntil(dialog.message_label.isVisible, timeout=5000)

    assert "No model found at broken-model" in dialog.message_label.text()
    assert not dialog.load_button.isEnabled()


def test_the_load_dialog_offers_every_device_and_precision_the_engine_takes_and_no_other():
    assert sorted(value for _label, value in load_dialog.PRECISIONS) == sorted(messages.PRECISIONS)
    assert sorted(value for _label, value in load_dialog.DEVICES) == sorted(messages.DEVICES)
    assert {value for _label, value in load_dialog.KV_CACHES} <= set(messages.KV_CACHES)


def test_the_open_dialog_starts_in_the_home_folder_then_where_the_last_model_was(
    qtbot, chat, window, gguf_file, monkeypatch
):
    chat.wait_until_ready()
    opened_in: list[str] = []

    def pick(_parent, _caption, folder, _filter):
        opened_in.append(folder)
        return str(gguf_file), ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", pick)
    action = _model_action(window, "&Open model file…")
    action.trigger()
    _open_load_dialog(qtbot, window).reject()
    action.trigger()

    assert opened_in == [str(Path.home()), str(gguf_file.parent)]


def test_the_draft_model_chosen_in_the_load_dialog_loads_and_is_offered_again_for_that_model(
    qtbot, chat, window, script, gguf_file, monkeypatch
):
    chat.wait_until_ready()
    draft = gguf_file.with_name("small-draft.gguf")
    draft.write_bytes(b"GGUF")
    dialog = window.model_loader.choose(str(gguf_file))
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)
    assert dialog.draft_box.currentData() == ""  # none until chosen
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args, **kwargs: (str(draft), ""))
    dialog.draft_box.setCurrentIndex(dialog.draft_box.findData("pick"))
    dialog.draft_box.activated.emit(dialog.draft_box.currentIndex())
    assert dialog.draft_box.currentText() == "small-draft.gguf"
    qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    _wait_for_model(qtbot, window, "Fake tiny-chat.gguf")
    assert script.loads[-1].options.draft_model == str(draft)

    again = window.model_loader.choose(str(gguf_file))  # the file's choice comes back, in the settings file too
    assert (again.draft_box.currentText(), again.options().draft_model) == ("small-draft.gguf", str(draft))
    assert load_settings().settings.draft_model_for(str(gguf_file)) == str(draft)
    again.draft_box.setCurrentIndex(again.draft_box.findData("default"))
    again.draft_box.activated.emit(again.draft_box.currentIndex())
    assert again.options().draft_model == "default"
    again.reject()
    other = window.model_loader.choose(str(gguf_file.with_name("other.gguf")))  # another model: none
    assert other.options().draft_model is None
    other.reject()


def test_the_weights_row_says_which_experts_stay_in_their_file_format(qtbot, chat, window, script):
    """gpt-oss on the CPU: most of its bytes are MXFP4 experts, kept so whatever precision the layers take."""
    script.expert_format = "MXFP4"
    chat.wait_until_ready()
    dialog = window.model_loader.choose("/models/gpt-oss.gguf")
    qtbot.waitUntil(lambda: dialog.inspected is not None, timeout=5000)
    assert dialog.findChild(QLabel, "estimate_weights_name").text() == "Weights (fp32, MXFP4 experts)"
    dialog.reject()
