"""A reply the full disk would not take stays in a lasting warning until a retry saves it."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel


def test_unsaved_reply_is_warned_about_until_it_is_saved(chat, script, reopen):
    store = chat.window.journal.store
    warning = chat.window.findChild(QLabel, "unsavedWarning")
    script.reply_tokens = tuple(f" word{index}" for index in range(2000))  # ~14 KB: more than a page
    script.token_delay_s = 0.001
    chat.wait_until_ready()
    chat.type_and_press_enter("Tell me a long story")
    chat.qtbot.waitUntil(lambda: "word3" in chat.last_reply().content, timeout=5000)
    page_count = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {page_count}")  # SQLITE_FULL, as a full disk
    chat.wait_until_reply_ends()

    assert warning.isVisible() and "disk is full" in warning.text()
    chat.qtbot.wait(100)
    assert warning.isVisible()  # lasting, unlike a notice

    store._db.execute("PRAGMA max_page_count = 1073741823")  # space came back
    chat.qtbot.waitUntil(lambda: not warning.isVisible(), timeout=10_000)
    assert reopen().session.conversation.messages[-1].content == script.full_reply
