"""Routes an engine's own host-to-device staging through pinstage.

Importing pinstage never imports an engine; `pinstage.integrations.<engine>` imports it when used.
"""
