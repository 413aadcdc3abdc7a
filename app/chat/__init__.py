"""The chat view and its cards, and one prompt's way from the Send button to the engine and back (GUI thread).

``chat_session`` sends the user's message and streams the reply into the view;
``chat_view`` and ``card_column`` lay out the cards a page at a time;
``message_bubble``, ``reply_view``, ``markdown_render`` and ``code_blocks`` draw one
message; ``input_box`` is where the user types; ``message_actions`` are Copy,
Edit, Regenerate and Delete.
"""
