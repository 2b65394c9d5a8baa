"""safe_eval: what it computes, what it refuses, and that nothing else escapes."""

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.safe_eval import SafeEvalError, safe_eval


@pytest.mark.parametrize("expression, expected", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 / 2", 3.5), ("7 // 2", 3), ("7 % 3", 1), ("2 ** 10", 1024),
    ("-3 + +2", -1), ("not 0", True), ("3 > 2 > 1", True), ("1 == 2", False),
    ("max(3, 9, 4)", 9), ("min([3, 9, 4])", 3), ("abs(-2.5)", 2.5), ("round(2.675, 2)", 2.67),
    ("sum([1, 2, 3])", 6), ("len((1, 2, 3))", 3), ("[1, 2 * 2]", [1, 4]), ("(1, 2)", (1, 2)),
    ("math.sqrt(16)", 4.0), ("math.floor(math.pi)", 3), ("math.comb(5, 2)", 10), ("math.log10(1000)", 3.0),
    ("(2745.5 - 1224.1) / 1224.1 * 100", (2745.5 - 1224.1) / 1224.1 * 100),
])
def test_arithmetic(expression, expected):
    assert safe_eval(expression) == expected


@pytest.mark.parametrize("expression, reason", [
    ("9**9**9", "too large"), ("10 ** 101", "too large"), ("2.0 ** 100000", "exponent too large"),
    ("math.factorial(10**6)", "too large"), ("math.comb(10**5, 5000)", "too large"),
    ("1 / 0", "ZeroDivisionError"), ("5 % 0", "ZeroDivisionError"), ("0 ** -1", "negative power"),
    ("(-8) ** 0.5", "complex"), ("math.sqrt(-1)", "ValueError"), ("math.exp(1000)", "OverflowError"),
    ("__import__('os').system('echo hi')", "not allowed"), ("().__class__.__bases__", "not allowed"),
    ("math.__dict__", "not allowed"), ("(lambda: 1)()", "not allowed"), ("[x for x in range(10**9)]", "not allowed"),
    ("open('/etc/passwd')", "not allowed"), ("'a' * 10", "not allowed"), ("[1] * 10**9", "not a number"),
    ("x + 1", "not allowed"), ("1j * 2", "not allowed"), ("max(a=1)", "keyword"), ("min()", "TypeError"),
    ("9" * 200, "too large"), ("1 + " * 200 + "1", "longer than"),
    ("-" * 120 + "1", "nested too deeply"), ("", "empty"), ("1 +", "not an expression"), ("1; 2", "not an expression"),
    ("round(1.5, 10**9)", "too many digits"), ("sum([[1], [2]])", "not a number"), ("1 if 1 else 2", "not allowed"),
    ("True and False", "not allowed"), ("math.inf", "not allowed"), ("float('nan')", "not allowed"),
])
def test_refused_with_a_reason(expression, reason):
    with pytest.raises(SafeEvalError, match=reason):
        safe_eval(expression)


def test_deep_nesting_is_refused_even_when_long_input_is_allowed():
    with pytest.raises(SafeEvalError, match="not an expression"):
        safe_eval("(" * 1000 + "1" + ")" * 1000, max_chars=5000)
    with pytest.raises(SafeEvalError, match="nested too deeply"):
        safe_eval("abs(" * 60 + "1" + ")" * 60, max_chars=5000)
    assert safe_eval("(" * 100 + "1" + ")" * 100) == 1  # parentheses alone add no depth


def test_a_descheduled_process_still_computes_a_valid_expression(monkeypatch):
    """The work is bounded by the input limits, not by a clock: seconds passing between node visits (a busy
    machine) refuse nothing."""
    seconds = iter(range(0, 10**6, 5))
    monkeypatch.setattr(time, "monotonic", lambda: next(seconds))
    monkeypatch.setattr(time, "perf_counter", lambda: next(seconds))
    assert safe_eval("math.comb(1000, 998) + 10 ** 99 // 10 ** 98 + max(1, 2, 3)") == 499513


def test_non_string_is_refused():
    with pytest.raises(SafeEvalError):
        safe_eval(None)  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789+-*/%().,[] <>=!eEjx_mathsqrlogpowfcinbd", max_size=80))
def test_random_text_yields_a_number_or_its_own_error(text):
    try:
        value = safe_eval(text)
    except SafeEvalError:
        return
    assert isinstance(value, (int, float, bool, list, tuple))
    if isinstance(value, float):
        assert math.isfinite(value) and abs(value) <= 1e100


_numbers = st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(-1e6, 1e6, allow_nan=False).map(repr))


@st.composite
def expressions(draw, depth=0):
    if depth > 4 or draw(st.booleans()):
        return draw(_numbers)
    kind = draw(st.sampled_from(["bin", "unary", "call", "cmp"]))
    if kind == "bin":
        op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]))
        return f"({draw(expressions(depth + 1))} {op} {draw(expressions(depth + 1))})"
    if kind == "unary":
        return f"-({draw(expressions(depth + 1))})"
    if kind == "cmp":
        return f"({draw(expressions(depth + 1))} < {draw(expressions(depth + 1))})"
    function = draw(st.sampled_from(["max", "min", "abs", "math.sqrt", "math.factorial", "math.exp", "round"]))
    args = ", ".join(draw(st.lists(expressions(depth + 1), min_size=1, max_size=3)))
    return f"{function}({args})"


@settings(max_examples=500, deadline=None)
@given(expressions())
def test_random_arithmetic_never_escapes(expression):
    try:
        value = safe_eval(expression, max_chars=10_000)
    except SafeEvalError:
        return
    assert isinstance(value, (int, float, bool))


def test_parser_warnings_on_odd_literals_stay_quiet():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for text in ("1or 2", "1if 1 else 2", "0x1for"):  # the parser warns on each
            with pytest.raises(SafeEvalError):
                safe_eval(text)
    assert [w for w in caught if issubclass(w.category, SyntaxWarning)] == []
