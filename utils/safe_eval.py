"""Arithmetic from untrusted text (LLM output), evaluated by walking a whitelisted AST. Never eval or exec.

Allowed: int and float literals, + - * / // % **, comparisons, unary + - not, parentheses, list and tuple
literals, min max abs round sum len, and the functions and constants of `math` named in MATH. Every
intermediate value is checked against a magnitude limit, and powers and the factorial family are checked
before they are computed. With the limits on length, depth and sequence size, that bounds the work without a
clock, so a busy machine never refuses a valid expression. Anything else raises SafeEvalError with the reason;
nothing else is ever raised.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable
from typing import Any

Number = int | float
Value = Number | bool | list | tuple

MAX_CHARS = 300
MAX_DEPTH = 40
MAX_MAGNITUDE = 1e100
MAX_ITEMS = 200

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_}
_BUILTINS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs, "round": round, "sum": sum, "len": len}
MATH = ("sqrt", "isqrt", "exp", "log", "log2", "log10", "log1p", "pow", "fabs", "floor", "ceil", "trunc",
        "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "degrees", "radians",
        "hypot", "gcd", "lcm", "fsum", "prod", "factorial", "comb", "perm", "copysign", "fmod", "remainder",
        "isclose", "dist", "cbrt")
MATH_CONSTANTS = ("pi", "e", "tau")
_COMBINATORIAL = ("factorial", "comb", "perm")
MAX_COMBINATORIAL_ARG = 1000


class SafeEvalError(ValueError):
    """The expression was refused or failed; the message says why."""


def safe_eval(expression: str, max_chars: int = MAX_CHARS) -> Value:
    if not isinstance(expression, str):
        raise SafeEvalError("not a string")
    text = expression.strip()
    if not text:
        raise SafeEvalError("empty expression")
    if len(text) > max_chars:
        raise SafeEvalError(f"longer than {max_chars} characters")
    try:
        with warnings.catch_warnings():  # untrusted text such as "1e" makes the parser warn on stderr
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise SafeEvalError(f"not an expression: {type(err).__name__}") from None
    return _Walker().visit(tree.body, 0)


def _check(value: Any) -> Value:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            raise SafeEvalError("result too large")
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value) or abs(value) > MAX_MAGNITUDE:
            raise SafeEvalError("result not finite or too large")
        return value
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_ITEMS:
            raise SafeEvalError("sequence too long")
        return type(value)(_check(item) for item in value)
    raise SafeEvalError(f"result of type {type(value).__name__} is not a number")


def _numbers(*values: Any) -> list[Number]:
    """`values`, each checked to be a number (a SafeEvalError otherwise)."""
    for value in values:
        if not isinstance(value, (int, float)):
            raise SafeEvalError(f"operand of type {type(value).__name__} is not a number")
    return list(values)


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > 10_000:
        raise SafeEvalError("exponent too large")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise SafeEvalError("power too large")
    if base == 0 and exponent < 0:
        raise SafeEvalError("zero to a negative power")


class _Walker:
    def visit(self, node: ast.AST, depth: int) -> Value:
        if depth > MAX_DEPTH:
            raise SafeEvalError("expression nested too deeply")
        try:
            return _check(self._visit(node, depth + 1))
        except SafeEvalError:
            raise
        except (ArithmeticError, ValueError, TypeError) as err:  # 1/0, math domain errors, bad arguments
            raise SafeEvalError(f"{type(err).__name__}: {err}") from None

    def _visit(self, node: ast.AST, depth: int) -> Any:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (int, float)) and not isinstance(node.value, complex):
                return node.value
            raise SafeEvalError(f"literal {type(node.value).__name__} is not allowed")
        if isinstance(node, (ast.List, ast.Tuple)):
            if len(node.elts) > MAX_ITEMS:
                raise SafeEvalError("sequence too long")
            items = [self.visit(element, depth) for element in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = _numbers(self.visit(node.left, depth), self.visit(node.right, depth))
            if isinstance(node.op, ast.Pow):
                _check_power(left, right)
            result = _BINARY[type(node.op)](left, right)
            if isinstance(result, complex):
                raise SafeEvalError("complex result")
            return result
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            operand = self.visit(node.operand, depth)
            _numbers(operand)
            return _UNARY[type(node.op)](operand)
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            values = [self.visit(node.left, depth)] + [self.visit(c, depth) for c in node.comparators]
            _numbers(*values)
            return all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, values, values[1:]))
        if isinstance(node, ast.Attribute) and _is_math(node.value) and node.attr in MATH_CONSTANTS:
            return getattr(math, node.attr)
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        raise SafeEvalError(f"{type(node).__name__} is not allowed")

    def _call(self, node: ast.Call, depth: int) -> Any:
        if node.keywords:
            raise SafeEvalError("keyword arguments are not allowed")
        if isinstance(node.func, ast.Name) and node.func.id in _BUILTINS:
            name, function = node.func.id, _BUILTINS[node.func.id]
        elif isinstance(node.func, ast.Attribute) and _is_math(node.func.value) and node.func.attr in MATH:
            name, function = node.func.attr, getattr(math, node.func.attr)
        else:
            raise SafeEvalError(f"call of {ast.dump(node.func)[:60]} is not allowed")
        args = [self.visit(arg, depth) for arg in node.args]
        for arg in args:
            if isinstance(arg, (list, tuple)):
                _numbers(*arg)
            else:
                _numbers(arg)
        if name in _COMBINATORIAL and any(abs(a) > MAX_COMBINATORIAL_ARG for a in _numbers(*args)):
            raise SafeEvalError(f"{name} argument too large")
        if name == "round" and len(args) == 2 and abs(_numbers(args[1])[0]) > 20:
            raise SafeEvalError("round to too many digits")
        return function(*args)


def _is_math(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "math"
