"""The Celery tier: what DeadlineTask and DeadlineRequest do for Celery's hooks. Users import
nothing from here. Its modules, and a message's path through them: DEVELOPERS.md ("The tiers",
"The life of a message").
"""
