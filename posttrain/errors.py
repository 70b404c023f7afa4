"""User-facing errors: the CLI prints these as one line (``error: ...``) instead of a traceback.

Raise a subclass of ``UserError`` when the fix is on the user's side (a bad config key, a missing
file, a malformed row) and say in the message what to do.
"""


class UserError(Exception):
    pass
