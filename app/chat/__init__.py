"""The chat view and its cards, and one prompt's way from the Send button to the engine and back (GUI thread).

``chat_session`` sends the user's message and shows the conversation on screen;
``reply_router`` streams each reply into its own conversation (several may answer
at once) and saves it as it comes;
``chat_view`` and ``card_column`` lay out the cards a page at a time;
``message_bubble``, ``reply_view``, ``markdown_render`` and ``code_blocks`` draw one
message; ``input_box`` is where the user types; ``message_actions`` are Copy,
Edit, Regenerate and Delete.
"""
