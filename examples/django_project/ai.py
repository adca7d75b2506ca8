"""The model callable this Django project serves (any def / async def / generator works)."""

from __future__ import annotations

import asyncio


async def generate(req):
    """Streams the prompt back word by word, greeting the logged-in user if there is one."""
    user = req.session.user
    name = getattr(user, "username", "") if user is not None and getattr(user, "is_authenticated", False) else ""
    for word in f"{'Hello ' + name + '! ' if name else ''}You said: {req.prompt}".split():
        yield word + " "
        await asyncio.sleep(0.01)
