"""The class the grader imports."""

from models.system import CragSystem as UserModel

__all__ = ["UserModel"]
