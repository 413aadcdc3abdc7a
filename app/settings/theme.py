"""Hearth's look: one style sheet for the main window (GUI thread).

Colours are set explicitly, text included, so cards stay readable under a dark
system palette.
"""

STYLE_SHEET = """
#chatView, #chatContainer, #welcomePane { background: #f6f2ec; border: none; }
#welcomePane QLabel { color: #1f1f1f; }
#userBubble {
    background: #f3d9bf; border: 1px solid #e2bf9c; border-radius: 10px;
}
#assistantBubble {
    background: #ffffff; border: 1px solid #e3ddd4; border-radius: 10px;
}
#bubbleTitle { color: #8a5a2b; font-weight: bold; font-size: 11px; background: transparent; border: none; }
#assistantBubble #bubbleTitle { color: #5a6470; }
#bubbleBody { color: #1f1f1f; background: transparent; border: none; }
#bubbleNote { color: #7a7066; font-style: italic; font-size: 11px; background: transparent; border: none; }
#bubbleNote[state="error"] { color: #b3261e; font-style: normal; }
#toolCard { background: #f1f4f6; border: 1px solid #d5dde3; border-radius: 10px; }
#toolTitle { color: #3d5566; font-weight: bold; font-size: 11px; background: transparent; border: none; }
#toolStatus { color: #5a6470; font-size: 11px; background: transparent; border: none; }
#toolStatus[status="waiting"] { color: #8a5a2b; font-weight: bold; }
#toolStatus[status="error"], #toolStatus[status="timeout"] { color: #b3261e; font-weight: bold; }
#toolCaption { color: #5a6470; font-size: 11px; font-weight: bold; background: transparent; border: none; }
#toolArguments, #toolResult, #toolQuestion { color: #1f1f1f; background: transparent; border: none; }
#toolArguments { background: #e6ebef; border-radius: 4px; padding: 4px; }
#inputBar { background: #fbf9f6; border-top: 1px solid #e3ddd4; }
#prompt {
    background: #ffffff; color: #1f1f1f; border: 1px solid #d8d0c4; border-radius: 8px; padding: 4px;
}
#prompt:focus { border: 1px solid #c47a3a; }
#damageBanner { background: #fdecea; color: #8c1d18; border: 1px solid #f2b8b5; border-radius: 6px; padding: 6px; }
#sendButton, #stopButton { min-width: 72px; padding: 6px 12px; }
"""
