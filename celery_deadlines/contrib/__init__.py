"""The integrations: one module per third-party tool, named after it, the only module that
imports that tool. The map: DEVELOPERS.md ("The tiers").
"""
