"""The `calculator` tool: exact arithmetic over Python's expression syntax, without eval.

The expression is parsed with `ast` and only numbers, + - * / // % **, unary signs and
parentheses are evaluated, over `fractions.Fraction`, so 0.1 + 0.2 is 3/10 and big
integers stay exact. Bounds keep one call cheap: expression length, exponent size and
the size of every intermediate result.
"""

from __future__ import annotations

import ast
import fractions
import operator

MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 10_000
MAX_DIGITS = 10_000  # of any intermediate numerator or denominator

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_SIGNS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
  """An expression the calculator refuses; the message is what the model reads."""


def _digits(value: fractions.Fraction) -> int:
  return max(abs(value.numerator).bit_length(), value.denominator.bit_length()) * 0.302


def _eval(node) -> fractions.Fraction:
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return fractions.Fraction(str(node.value)) if isinstance(node.value, float) else \
        fractions.Fraction(node.value)
  if isinstance(node, ast.UnaryOp) and type(node.op) in _SIGNS:
    return _SIGNS[type(node.op)](_eval(node.operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    left, right = _eval(node.left), _eval(node.right)
    if type(node.op) in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
      raise CalculatorError("division by zero")
    out = _BINARY[type(node.op)](left, right)
  elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
    base, exponent = _eval(node.left), _eval(node.right)
    if exponent.denominator != 1:
      raise CalculatorError("only whole-number exponents are exact")
    if abs(exponent) > MAX_EXPONENT or (abs(base) > 1 and _digits(base) * abs(exponent) > MAX_DIGITS):
      raise CalculatorError(f"the power is too large (over {MAX_DIGITS} digits)")
    if base == 0 and exponent < 0:
      raise CalculatorError("division by zero")
    out = base ** int(exponent)
  else:
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else \
        type(node).__name__
    raise CalculatorError(f"unsupported syntax: {what} (numbers, + - * / // % ** and "
                          "parentheses only)")
  if _digits(out) > MAX_DIGITS:
    raise CalculatorError(f"a result is too large (over {MAX_DIGITS} digits)")
  return out


def format_number(value: fractions.Fraction) -> str:
  """An integer, a terminating decimal exactly, or `p/q (~ decimal)`."""
  if value.denominator == 1:
    return str(value.numerator)
  d = value.denominator
  for p in (2, 5):
    while d % p == 0:
      d //= p
  if d == 1:  # terminates: exact decimal
    whole, rest = divmod(abs(value.numerator), value.denominator)
    digits = []
    while rest:
      rest *= 10
      digit, rest = divmod(rest, value.denominator)
      digits.append(str(digit))
    return f"{'-' if value < 0 else ''}{whole}.{''.join(digits)}"
  return f"{value.numerator}/{value.denominator} (~ {float(value):.10g})"


def calculate(expression) -> str:
  """The exact value of `expression`; raises CalculatorError with a message for the model."""
  if not isinstance(expression, str):
    raise CalculatorError("expression must be a string")
  if len(expression) > MAX_EXPRESSION_CHARS:
    raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
  text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError) as e:
    raise CalculatorError(f"cannot parse the expression: {getattr(e, 'msg', e)}") from None
  try:
    return format_number(_eval(tree.body))
  except RecursionError:
    raise CalculatorError("the expression is nested too deeply") from None


CALCULATOR_SCHEMA = {
    "type": "object",
    "properties": {"expression": {
        "type": "string",
        "description": "an arithmetic expression, e.g. (1234 * 5678 - 9) / 7"}},
    "required": ["expression"],
    "additionalProperties": False,
}
