"""Empty handlers for benches/sdk/run.py: the SDK's own cost per child."""


async def empty(child):
    return None


def empty_sync(child):
    return None
