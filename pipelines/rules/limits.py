"""Static resource limits: refuse valid SQL that would exhaust the machine when it runs.

A rule's SQL can be perfectly valid and still take the JVM down: `sequence(1, 2000000000)`
builds an array of two billion elements per row (Spark even evaluates it while planning, with
no input row at all), `repeat('a,', 100000000)` a 200 MB string, `RLIKE '(a+)+$'` backtracks
exponentially, and a join without an equality condition pairs every row with every row.
Every query of `seclake stream` shares one JVM, so the OutOfMemoryError lands on whichever
thread allocates next. These checks run on the sqlglot tree, before anything runs:

1. **Allocation sizes.** The functions that allocate a value whose size is one of their
   arguments (repeat, rpad/lpad, space, array_repeat, sequence/range, array_insert's position,
   format_string/printf widths, the precision of approx_count_distinct and count_min_sketch)
   must get literal sizes within bounds. A computed size is refused, except that sequence()
   and array_insert() may be bounded by `size(<array>)` plus or minus a literal: such an array
   is bounded by the data (c2_beaconing differences the elements of an hour's array with
   `sequence(1, size(starts) - 1)`).
2. **Regular expressions** must be string literals without nested quantifiers.
3. **Joins** must have an equality between a column of each side.

Each check raises RuleError naming the line (when sqlglot knows it), the SQL fragment and the
reason; `validate_rule` prefixes the rule's file.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException, InvalidOperation

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

# Bounds and why. A rule is evaluated per row (or per group) of a micro-batch of thousands of
# rows, in a driver and executors that share a few GB with the ETL and every other rule.
MAX_ALLOCATION = 10_000
"""Largest count of repeat()/array_repeat() (times the length of a literal string repeated),
length of rpad()/lpad()/space(), width or precision in a format_string()/printf() format and
position of array_insert() (which pads with NULLs up to it). Detection rules pad or repeat
for display at most: 10,000 characters is a page of text, far above any real use."""
MAX_SEQUENCE = 100_000
"""Most elements of a sequence() (or range()) with literal bounds: 100,000 integers are under
1 MB; a day in seconds (86,400) fits."""
MAX_ALLOCATION_PRODUCT = 1_000_000
"""The validator does not follow values through CTEs, lambdas or lateral views, so any of the
sizes above may multiply another (`repeat(rpad(x, 10000), 10000)`, a lambda over a sequence
that repeats, two exploded sequences). Their product over the whole rule stays under a million."""
MIN_APPROX_RSD = Decimal("0.01")
"""approx_count_distinct(x, rsd): HyperLogLog++ keeps 2^p registers per group with
p = ceil(2 log2(1.106 / rsd)); rsd 0.01 gives 16,384 (12 KB), rsd 1e-9 would give 2^61."""
MIN_SKETCH_EPS = Decimal("0.001")
MAX_SKETCH_CONFIDENCE = Decimal("0.9999")
"""count_min_sketch(x, eps, confidence, seed) keeps ceil(2 / eps) x ceil(-log2(1 - confidence))
longs per group: at these bounds 2,000 x 14 (224 KB)."""

_SIZE_FUNCTIONS = frozenset({"size", "array_size", "cardinality"})
# The functions whose pattern argument(s) (0-based positions) are Java regular expressions.
REGEX_FUNCTIONS: dict[str, tuple[int, ...]] = {
    "rlike": (1,), "regexp": (1,), "regexp_like": (1,), "regexp_extract": (1,), "regexp_extract_all": (1,),
    "regexp_replace": (1,), "regexp_count": (1,), "regexp_substr": (1,), "regexp_instr": (1,),
    "split": (1,), "str_to_map": (1, 2),
}
_CANONICAL = {"printf": "format_string", "range": "sequence", "array_size": "size"}


class LimitError(ValueError):
    """A refusal: `spec.check_query` turns it into a RuleError."""


def check_limits(tree: exp.Expr, schemas: dict, *, line_offset: int = 0) -> None:
    """Raise LimitError for the first construct that could exhaust memory or CPU."""
    sizes: list[tuple[int, exp.Expr]] = []
    for node in tree.walk():
        if isinstance(node, exp.Func):
            name = _name(node)
            if name in REGEX_FUNCTIONS or _is_regex_node(node):
                _check_regex_call(node, name, line_offset)
            size = _check_allocation(node, name, line_offset)
            if size is not None:
                sizes.append((size, node))
        if isinstance(node, exp.Select):
            _check_joins(node, tree, schemas, line_offset)
    product = math.prod(max(1, s) for s, _ in sizes)
    if product > MAX_ALLOCATION_PRODUCT:
        big = sorted(sizes, key=lambda item: -item[0])[:4]
        parts = " x ".join(f"{_snippet(n, 40)} ({s:,})" for s, n in big)
        raise LimitError(f"{_where(big[0][1], line_offset)}the sizes this rule allocates multiply to {product:,} "
                         f"(limit {MAX_ALLOCATION_PRODUCT:,}): {parts}; the validator assumes any of them may feed "
                         "another (directly, through a CTE, a lambda or a lateral view)")


# ---------------------------------------------------------------- positions and names

def _line(node: exp.Expr) -> int | None:
    lines = [n.meta["line"] for n in node.walk() if n.meta and "line" in n.meta]
    return min(lines) if lines else None


def _snippet(node: exp.Expr, width: int = 80) -> str:
    text = node.sql(dialect="spark")
    return text if len(text) <= width else text[:width - 3] + "..."


def _where(node: exp.Expr, line_offset: int) -> str:
    line = _line(node)
    return f"line {line + line_offset}: " if line is not None else ""


def _refuse(node: exp.Expr, line_offset: int, reason: str) -> LimitError:
    return LimitError(f"{_where(node, line_offset)}{_snippet(node)}: {reason}")


def _name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        name = str(node.name).lower()
    elif isinstance(node, exp.Pad):
        name = "lpad" if node.args.get("is_left") else "rpad"
    else:
        name = {exp.Repeat: "repeat", exp.Space: "space", exp.GenerateSeries: "sequence",
                exp.ArrayInsert: "array_insert", exp.Format: "format_string",
                exp.ApproxDistinct: "approx_count_distinct",
                exp.ArraySize: "size", exp.RegexpSplit: "split", exp.StrToMap: "str_to_map",
                exp.RegexpLike: "rlike"}.get(type(node)) or (type(node).sql_names() or [node.key])[0].lower()
    return _CANONICAL.get(name, name)


def _is_regex_node(node: exp.Func) -> bool:
    return not isinstance(node, exp.Anonymous) and type(node).__name__.startswith("Regexp")


_ARG_ORDER: dict[type, tuple[str, ...]] = {
    exp.Repeat: ("this", "times"), exp.Pad: ("this", "expression", "fill_pattern"), exp.Space: ("this",),
    exp.GenerateSeries: ("start", "end", "step"), exp.ArrayInsert: ("this", "position", "expression"),
    exp.Format: ("this", "expressions"), exp.ApproxDistinct: ("this", "accuracy"),
    exp.StrToMap: ("this", "pair_delim", "key_value_delim"),
}


def _args(node: exp.Func) -> list[exp.Expr | None]:
    """The call's arguments in Spark's positional order."""
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    keys = _ARG_ORDER.get(type(node))
    if keys is None:
        keys = ("this", "expression") if _is_regex_node(node) else tuple(node.arg_types)
    out: list[exp.Expr | None] = []
    for key in keys:
        value = node.args.get(key)
        if isinstance(value, list):
            out.extend(value)
        else:
            out.append(value if isinstance(value, exp.Expr) else None)
    while out and out[-1] is None:
        out.pop()
    return out


# ---------------------------------------------------------------- constants and bounds

def _constant(node: exp.Expr | None) -> Decimal | None:
    """The value of a numeric constant expression (literals, + - *, casts), else None."""
    try:
        value = _fold(node)
    except (DecimalException, ArithmeticError):
        return None
    if value is None or not value.is_finite():
        return None
    # Keep later arithmetic (abs, products, span / step) far from the decimal context's limits:
    # anything beyond 1e30 is over every limit, anything under 1e-30 under every minimum.
    if value.adjusted() > 30:
        return Decimal("1e31").copy_sign(value)
    if value and value.adjusted() < -30:
        return Decimal("1e-31").copy_sign(value)
    return value


def _fold(node: exp.Expr | None) -> Decimal | None:
    while isinstance(node, (exp.Paren, exp.Cast)):  # TryCast is a Cast: 5L, CAST(5 AS INT)
        node = node.this
    if isinstance(node, exp.Literal):
        try:
            return Decimal(str(node.this).strip())
        except InvalidOperation:
            return None
    if isinstance(node, exp.Neg):
        value = _fold(node.this)
        return None if value is None else -value
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        left, right = _fold(node.this), _fold(node.expression)
        if left is None or right is None:
            return None
        if isinstance(node, exp.Add):
            return left + right
        return left - right if isinstance(node, exp.Sub) else left * right
    return None


def _data_bound(node: exp.Expr | None) -> tuple[Decimal, int] | None:
    """`c`, `size(a) + c`, `size(a) - size(b) - c`, ...: (the constant part, how many size() terms)."""
    constant = _constant(node)
    if constant is not None:
        return constant, 0
    while isinstance(node, (exp.Paren, exp.Cast)):
        node = node.this
    if isinstance(node, exp.Func) and _name(node) in _SIZE_FUNCTIONS and len(_args(node)) == 1:
        return Decimal(0), 1
    if isinstance(node, exp.Neg):
        inner = _data_bound(node.this)
        return None if inner is None else (-inner[0], inner[1])
    if isinstance(node, (exp.Add, exp.Sub)):
        left, right = _data_bound(node.this), _data_bound(node.expression)
        if left is None or right is None:
            return None
        sign = 1 if isinstance(node, exp.Add) else -1
        return left[0] + sign * right[0], left[1] + right[1]
    return None


def _string(node: exp.Expr | None) -> str | None:
    if isinstance(node, exp.RawString) or (isinstance(node, exp.Literal) and node.is_string):
        return str(node.this)
    return None


# ---------------------------------------------------------------- allocation sizes

def _check_allocation(node: exp.Func, name: str, line_offset: int) -> int | None:
    """Check one call; return the size it allocates (for the rule-wide product) or None."""
    args = _args(node)

    def literal(index: int, what: str) -> Decimal:
        value = _constant(args[index]) if index < len(args) else None
        if value is None:
            raise _refuse(node, line_offset, f"{name}() {what} must be a numeric literal: a computed {what} is "
                                             "unbounded, and the validator cannot check it")
        return value

    def bounded(value: Decimal, what: str, limit: int, extra: str = "") -> int:
        if abs(value) > limit:
            raise _refuse(node, line_offset, f"{name}() {what} {_fmt(value)}{extra} exceeds the limit of {limit:,}: "
                                             "a value that large per row can exhaust the JVM's memory")
        return int(abs(value))

    if name in ("repeat", "array_repeat") and len(args) >= 2:
        count = max(literal(1, "count"), Decimal(0))
        text = _string(args[0])
        if text is not None and len(text) > 1:  # a literal string: the result is len x count characters
            return bounded(count * len(text), "size", MAX_ALLOCATION,
                           f" ({_fmt(count)} copies of {len(text)} characters)")
        return bounded(count, "count", MAX_ALLOCATION)
    if name in ("rpad", "lpad") and len(args) >= 2:
        return bounded(literal(1, "length"), "length", MAX_ALLOCATION)
    if name == "space" and args:
        return bounded(literal(0, "length"), "length", MAX_ALLOCATION)
    if name == "sequence" and args:
        return _check_sequence(node, args, line_offset)
    if name == "array_insert" and len(args) >= 2:
        bound = _data_bound(args[1])
        if bound is None:
            raise _refuse(node, line_offset, "array_insert() position must be an integer literal or size(<array>) "
                                             "plus or minus a literal: it pads the array with NULLs up to it")
        position = bounded(bound[0], "position", MAX_ALLOCATION)
        return position if bound[1] == 0 else 1
    if name == "format_string" and args:
        pattern = _string(args[0])
        if pattern is None:
            raise _refuse(node, line_offset, f"{name}() format must be a string literal: its widths allocate")
        widths = [int(w) for m in re.finditer(r"%(?:\d+\$)?[-#+ 0,(<]*(\d+)?(?:\.(\d+))?", pattern)
                  for w in m.groups() if w]
        return max([bounded(Decimal(w), "width", MAX_ALLOCATION) for w in widths], default=None)
    if name == "approx_count_distinct" and len(args) >= 2:
        rsd = literal(1, "relative standard deviation")
        if rsd < MIN_APPROX_RSD:
            raise _refuse(node, line_offset, f"approx_count_distinct() relative standard deviation {_fmt(rsd)} is "
                                             f"below {MIN_APPROX_RSD}: its sketch per group grows as 1/rsd^2")
        return None
    if name == "count_min_sketch" and len(args) >= 3:
        eps, confidence = literal(1, "eps"), literal(2, "confidence")
        if eps < MIN_SKETCH_EPS or confidence > MAX_SKETCH_CONFIDENCE:
            raise _refuse(node, line_offset, f"count_min_sketch() needs eps >= {MIN_SKETCH_EPS} and confidence <= "
                                             f"{MAX_SKETCH_CONFIDENCE}: its table per group is 2/eps x "
                                             "log2(1/(1-confidence)) longs")
        return None
    return None


def _check_sequence(node: exp.Func, args: list, line_offset: int) -> int:
    if len(args) == 1:  # range(n)
        args = [exp.Literal.number(0), args[0]]
    start, end = _data_bound(args[0]), _data_bound(args[1]) if len(args) > 1 else None
    if start is None or end is None:
        raise _refuse(node, line_offset, "sequence() bounds must be integer literals (at most "
                                         f"{MAX_SEQUENCE:,} elements apart) or size(<array>) plus or minus a literal: "
                                         "a computed bound is unbounded (dates and timestamps included)")
    step = Decimal(1)
    if len(args) > 2:
        given = _constant(args[2])
        if given is None or given == 0:
            raise _refuse(node, line_offset, "sequence() step must be a non-zero numeric literal")
        step = given
    span = abs(end[0] - start[0])
    if start[1] or end[1]:
        # Bounded by the arrays' sizes (the data) plus the constant part, which must be small.
        if span > MAX_SEQUENCE:
            raise _refuse(node, line_offset, f"sequence() bounds differ by {_fmt(span)} besides size(...), more than "
                                             f"the limit of {MAX_SEQUENCE:,} elements")
        return 1
    count = span / abs(step) + 1
    if count > MAX_SEQUENCE:
        elements = _fmt(count.to_integral_value(rounding="ROUND_FLOOR"))
        raise _refuse(node, line_offset, f"sequence() would build {elements} "
                                         f"elements, more than the limit of {MAX_SEQUENCE:,} (per row, and Spark may "
                                         "evaluate it while planning)")
    return int(count)


def _fmt(value: Decimal) -> str:
    if value.adjusted() > 30:  # 1e999999999: do not build the integer
        return f"{value:.0e}"
    return f"{int(value):,}" if value == value.to_integral_value() else str(value)


# ---------------------------------------------------------------- regular expressions

def _check_regex_call(node: exp.Func, name: str, line_offset: int) -> None:
    args = _args(node)
    positions = REGEX_FUNCTIONS.get(name, (1,))
    for position in positions:
        if position >= len(args) or args[position] is None:
            continue
        pattern = args[position]
        if isinstance(pattern, (exp.Any, exp.All)):  # x RLIKE ANY ('a', 'b')
            inner = pattern.this.unnest() if isinstance(pattern.this, exp.Paren) else pattern.this
            literals = inner.expressions if isinstance(inner, exp.Tuple) else [inner]
        else:
            literals = [pattern]
        for literal in literals:
            text = _string(literal)
            if text is None:
                raise _refuse(node, line_offset, f"{name}() pattern must be a string literal: a computed regular "
                                                 "expression cannot be checked for catastrophic backtracking")
            for variant in {v for v in (text, _as_spark_reads(literal)) if v is not None}:
                problem = regex_problem(variant)
                if problem:
                    raise _refuse(node, line_offset, f"regular expression {variant!r} {problem}")


def _as_spark_reads(literal: exp.Expr) -> str | None:
    """The pattern Spark gets from the regenerated SQL (sqlglot and Spark unescape alike; check both)."""
    try:
        again = sqlglot.parse_one(literal.sql(dialect="spark"), dialect="spark")
    except SqlglotError:
        return None
    return _string(again)


class _BadRegex(ValueError):
    pass


def regex_problem(pattern: str) -> str | None:
    """Why a Java regular expression is refused, or None.

    The heuristic refuses nested quantifiers: a group repeated without bound (`*`, `+`,
    `{n,}`) that contains a quantifier allowing a variable count (`*`, `+`, `?`, `{n,m}`),
    like `(a+)+`, `(a*)*`, `(a|a?)+` or `(\\w+\\s?)*`, and a group repeated a bounded number
    of times (`{n,m}`, m > 1) that contains an unbounded quantifier, like `(a+){2,10}`.
    There the engine can split a run of text between the iterations in exponentially (or
    polynomially, to a high degree) many ways and tries them all before failing. Accepted:
    bounded inside bounded (`(\\d{1,3}\\.){3}`, a dotted quad), and a possessive quantifier
    (`a++`, `(...)++`) or an atomic group (`(?>...)`), which give nothing back. The check is
    conservative (`(\\.[a-z]+)+` is refused, although the dot makes it safe) and does not
    catch every slow pattern (`(a|aa)+`, `.*a.*a.*a.*a`).

    >>> regex_problem("(a+)+$") is not None, regex_problem("^[a-z0-9-]{20,}\\\\.") is None
    (True, True)
    """
    parser = _RegexParser(pattern)
    try:
        parser.parse()
    except _BadRegex as exc:
        return f"is not a valid Java regular expression for the validator ({exc})"
    if parser.problem:
        return (f"nests quantifiers in {parser.problem!r}: catastrophic backtracking in Java's regex engine; "
                "rewrite it without a repeated group that contains a quantifier, or make the inner quantifier "
                "possessive (a++) or atomic ((?>a+))")
    return None


class _RegexParser:
    """Just enough of java.util.regex.Pattern's syntax to find groups, quantifiers and classes."""

    _BRACES = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")
    _FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")

    def __init__(self, pattern: str) -> None:
        self.p, self.i = pattern, 0
        self.problem: str | None = None

    def parse(self) -> None:
        self._sequence()
        if self.i < len(self.p):
            raise _BadRegex(f"unmatched ')' at {self.i}")

    def _sequence(self) -> set[str]:
        """Parse up to an unmatched ')' or the end; return which backtracking quantifiers occur in it:
        'variable' (a count that may vary: *, +, ?, {n,m}) and 'unbounded' (*, +, {n,})."""
        p, contains = self.p, set[str]()
        while self.i < len(p):
            char, start = p[self.i], self.i
            if char == ")":
                return contains
            if char == "|":
                self.i += 1
                continue
            group_contains: set[str] = set()
            if char == "\\":
                self._escape()
            elif char == "[":
                self._char_class()
            elif char == "(":
                kind = self._open_group()
                if kind == "flags":
                    continue
                inner = self._sequence()
                if self.i >= len(p):
                    raise _BadRegex(f"unclosed group at {start}")
                self.i += 1
                group_contains = set() if kind == "atomic" else inner
            else:
                self.i += 1
            quantifier = self._quantifier()
            if quantifier:
                low, high, mode = quantifier
                if mode != "possessive" and self.problem is None and (
                        (high is None and group_contains)                       # (a+)+ (a?)* (a{1,3})+
                        or (high is not None and high > 1 and "unbounded" in group_contains)):  # (a+){2,5}
                    self.problem = p[start:self.i]
                if mode != "possessive" and low != high:
                    contains.add("variable")
                    if high is None:
                        contains.add("unbounded")
            contains |= group_contains
        return contains

    def _escape(self) -> None:
        p, i = self.p, self.i
        if i + 1 >= len(p):
            raise _BadRegex("trailing backslash")
        following = p[i + 1]
        if following == "Q":
            end = p.find("\\E", i + 2)
            self.i = len(p) if end < 0 else end + 2
        elif following in "pPxN" and i + 2 < len(p) and p[i + 2] == "{":
            end = p.find("}", i + 2)
            if end < 0:
                raise _BadRegex(f"unclosed \\{following}{{ at {i}")
            self.i = end + 1
        elif following == "k" and i + 2 < len(p) and p[i + 2] == "<":
            end = p.find(">", i + 2)
            if end < 0:
                raise _BadRegex(f"unclosed \\k< at {i}")
            self.i = end + 1
        else:
            self.i = i + 2

    def _char_class(self) -> None:
        p, start = self.p, self.i
        self.i += 1
        if self.i < len(p) and p[self.i] == "^":
            self.i += 1
        if self.i < len(p) and p[self.i] == "]":  # a ']' first is literal
            self.i += 1
        depth = 1
        while self.i < len(p):
            char = p[self.i]
            if char == "\\":
                self._escape()
                continue
            self.i += 1
            if char == "[":
                depth += 1
            elif char == "]":
                depth -= 1
                if depth == 0:
                    return
        raise _BadRegex(f"unclosed character class at {start}")

    def _open_group(self) -> str:
        p, i = self.p, self.i
        if not p.startswith("(?", i):
            self.i += 1
            return "group"
        following = p[i + 2:i + 3]
        if following == ":":
            self.i += 3
            return "group"
        if following == ">":
            self.i += 3
            return "atomic"
        if following in ("=", "!"):
            self.i += 3
            return "lookaround"
        if following == "<":
            if p[i + 3:i + 4] in ("=", "!"):
                self.i += 4
                return "lookaround"
            end = p.find(">", i + 3)
            if end < 0:
                raise _BadRegex(f"unclosed group name at {i}")
            self.i = end + 1
            return "group"
        match = self._FLAGS.match(p, i)
        if not match:
            raise _BadRegex(f"unknown group construct at {i}")
        if "x" in match.group(1).lower():
            raise _BadRegex("comments mode (?x) is not supported")
        self.i = match.end()
        return "flags" if match.group(3) == ")" else "group"

    def _quantifier(self) -> tuple[int, int | None, str] | None:
        p, i = self.p, self.i
        if i >= len(p):
            return None
        if p[i] in "*+?":
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[p[i]]
            self.i += 1
        elif p[i] == "{" and (match := self._BRACES.match(p, i)):
            low = int(match.group(1))
            high = low if not match.group(2) else (int(match.group(3)) if match.group(3) else None)
            self.i = match.end()
        else:
            return None
        mode = "greedy"
        if self.i < len(p) and p[self.i] in "?+":
            mode = "lazy" if p[self.i] == "?" else "possessive"
            self.i += 1
        return low, high, mode


# ---------------------------------------------------------------- joins

def _check_joins(select: exp.Select, tree: exp.Expr, schemas: dict, line_offset: int) -> None:
    joins = select.args.get("joins") or []
    if not joins:
        return
    source = select.args.get("from_") or select.args.get("from")
    left: dict[str, list[str] | None] = {}
    if source is not None:
        left.update(_source_columns(source.this, tree, schemas))
    for join in joins:
        right = _source_columns(join.this, tree, schemas)
        _check_join(join, left, right, line_offset)
        left.update(right)


def _check_join(join: exp.Join, left: dict, right: dict, line_offset: int) -> None:
    kind = (join.args.get("kind") or "").upper()
    method = (join.args.get("method") or "").upper()
    if kind == "CROSS":
        what = ("a cross join (CROSS JOIN, or tables separated by commas in FROM) pairs every row with every row "
                "of the other side, which can exhaust memory")
    elif method == "NATURAL":
        what = ("a NATURAL JOIN joins on whatever columns the sides happen to share (none: a cross join); name the "
                "key columns with ON or USING")
    elif join.args.get("using"):
        return
    else:
        condition = join.args.get("on")
        if condition is not None and any(_is_key_equality(c, left, right) for c in _conjuncts(condition)):
            return
        what = ("a join needs an equality between a column of each side in its ON condition (qualify the columns "
                "with their table aliases, e.g. ON a.src_ip = b.src_ip): without one every row meets every row of "
                "the other side, which can exhaust memory")
    raise LimitError(f"{_where(join, line_offset)}{_snippet(join)}: {what}")


def _conjuncts(condition: exp.Expr) -> list[exp.Expr]:
    condition = condition.unnest() if isinstance(condition, exp.Paren) else condition
    if isinstance(condition, exp.And):
        return _conjuncts(condition.this) + _conjuncts(condition.expression)
    return [condition]


def _is_key_equality(condition: exp.Expr, left: dict, right: dict) -> bool:
    if not isinstance(condition, (exp.EQ, exp.NullSafeEQ)):
        return False
    sides = [_side(operand, left, right) for operand in (condition.this, condition.expression)]
    return set(sides) == {"left", "right"}


def _side(operand: exp.Expr, left: dict, right: dict) -> str | None:
    """'left' or 'right' when every column of the operand comes from that side; else None."""
    found = set()
    for column in operand.find_all(exp.Column):
        qualifier, name = column.table.lower(), column.name.lower()
        if qualifier:
            found.add("left" if qualifier in left else "right" if qualifier in right else None)
            continue
        in_left, in_right = _has_column(left, name), _has_column(right, name)
        found.add("left" if in_left is True and in_right is False else
                  "right" if in_right is True and in_left is False else None)
    return found.pop() if len(found) == 1 else None


def _has_column(sources: dict, name: str) -> bool | None:
    """True/False when known, None when a source's columns are unknown."""
    if any(cols is not None and name in cols for cols in sources.values()):
        return True
    return None if any(cols is None for cols in sources.values()) else False


def _source_columns(node: exp.Expr, tree: exp.Expr, schemas: dict) -> dict[str, list[str] | None]:
    """{alias: its column names (lower case), or None when unknown} for a FROM or JOIN source."""
    alias = node.alias_or_name.lower()
    if isinstance(node, exp.Table):
        cte = next((c for c in tree.find_all(exp.CTE) if c.alias_or_name.lower() == node.name.lower()), None)
        if cte is not None:
            return {alias: _select_columns(cte.this)}
        schema = schemas.get(node.name)
        return {alias: [f.lower() for f in schema.fieldNames()] if schema is not None else None}
    if isinstance(node, exp.Subquery):
        return {alias: _select_columns(node.this)}
    return {alias: None}


def _select_columns(query: exp.Expr) -> list[str] | None:
    while isinstance(query, exp.Union):
        query = query.this
    if not isinstance(query, exp.Select) or any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and
                                                isinstance(e.this, exp.Star)) for e in query.expressions):
        return None
    return [name.lower() for name in query.named_selects]
