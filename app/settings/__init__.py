"""Settings and appearance (GUI thread).

``app_settings`` holds the settings in memory and saves them; ``settings_dialog``,
``sampling_form`` and ``saving_dialog`` are the dialogs that edit them;
``appearance`` switches light and dark themes built from ``theme``.
"""
