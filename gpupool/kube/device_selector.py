"""A small, safe reader of DRA device selectors (CEL), for the extender's card choice of claim pods
(issue 24, docs/dra.md "Steering claim pods", "Selectors the extender reads").

Why: kube-scheduler's DRA filter keeps the nodes where some card matches a claim's selectors, but
the extender then scores each node by its best card for gpupool, which may be a card the selector
excludes (the node's A100 is full, its V100 has room, the claim asks for an A100): the pod would be
steered to a node the allocator then fills with the only card it may use. Reading the selectors
lets the extender consider only the cards they allow.

Only a subset of CEL is read, the one gpupool's documented selectors and the common examples use:

* ``device.driver``; ``device.attributes["<domain>"].<name>`` (or ``["<name>"]``) and
  ``device.capacity["<domain>"].<name>`` for the attributes and capacities the extender knows
  gpupool's devices to publish (:func:`device_schema`);
* string, int and bool literals; ``quantity("40Gi")``;
* ``==`` ``!=`` ``<`` ``<=`` ``>`` ``>=`` between two values of one type (string, int, bool);
* ``.startsWith`` ``.endsWith`` ``.contains`` on strings; ``.compareTo`` ``.isGreaterThan``
  ``.isLessThan`` between quantities;
* ``"<name>" in device.attributes["<domain>"]`` (and in ``device.capacity[...]``);
* ``<string or int> in [<literals of its type>]`` (the resource groups' selector on claims,
  :mod:`gpupool.kube.claim_groups`, lists card UUIDs so);
* ``&&`` ``||`` (with CEL's error absorption: ``false && error`` is false), ``!``, parentheses.

Everything else (``.matches``, whose regular expressions could take exponential time here,
versions, macros, arithmetic, other domains' attributes the extender cannot see, a type mismatch
CEL's checker would refuse or that depends on values) raises :class:`Unsupported` with the reason;
the caller then leaves the claim to kube-scheduler's own choice, as before selectors were read.

Safety: the text is tokenized by hand and parsed by recursive descent into frozen nodes, never
handed to ``eval`` nor turned into a regular expression; its length, token count and nesting depth
are bounded before any work proportional to them, so a hostile selector is refused in microseconds.
Evaluation only walks the tree (no loops, no calls out), so it is linear in the tree's size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import TypeAlias

from gpupool.api.dra import (
    ATTR_INDEX,
    ATTR_KIND,
    ATTR_MODEL,
    ATTR_PARENT,
    ATTR_PROFILE,
    ATTR_UUID,
    COMPUTE,
    MEMORY,
)
from gpupool.kube.quantity import QuantityError, parse_quantity

MAX_EXPRESSION_CHARS = 10 * 1024
"""Kubernetes' own limit on one CEL selector expression."""
MAX_TOKENS = 256
"""About 25 comparisons, more than any selector of the subset needs; a longer one is refused before
parsing (it also bounds a chain of ``&&``, whose tree evaluation recurses along). String and int
literals and commas are not counted: they nest nothing, and a list of literals (``in [...]``) may
hold a few hundred within :data:`MAX_EXPRESSION_CHARS`."""
MAX_DEPTH = 24
"""Nesting (parentheses, ``!``, operators) the parser follows; deeper is refused, not recursed."""
MAX_STRING_CHARS = 1024
"""A string literal longer than this is refused (no attribute value comes near it)."""
MAX_SELECTORS = 32
"""Kubernetes allows 32 selectors per request."""


class Unsupported(ValueError):
    """The selector is outside the subset (or malformed, or too large): the reason, in words."""


class EvalError(Exception):
    """A runtime error of CEL for one device (an attribute it does not have)."""


class Kind(Enum):
    """The static type of an expression."""

    STRING = "string"
    INT = "int"
    BOOL = "bool"
    QUANTITY = "quantity"
    ATTRIBUTES = "attribute map"
    CAPACITY = "capacity map"


Value: TypeAlias = str | int | bool | Decimal


@dataclass(frozen=True)
class Device:
    """One device as a selector sees it: its driver, attributes and capacities by domain."""

    driver: str
    attributes: Mapping[str, Mapping[str, str | int | bool]]
    capacity: Mapping[str, Mapping[str, Decimal]]


@dataclass(frozen=True)
class DeviceSchema:
    """What the reader may assume devices carry: attribute types and capacity names per domain
    (a name outside it is refused: the extender cannot evaluate what it does not see)."""

    attributes: Mapping[str, Mapping[str, Kind]]
    capacity: Mapping[str, frozenset[str]]


def device_schema(driver: str) -> DeviceSchema:
    """The attributes and capacities the extender knows for gpupool's devices (the node agent's
    ResourceSlice, gpupool/nodeagent/dra/resource_slice.py, also publishes the PCI bus ID under
    ``resource.kubernetes.io``; the extender's ledger does not hold it, so it is not here)."""
    attributes = {ATTR_MODEL: Kind.STRING, ATTR_UUID: Kind.STRING, ATTR_INDEX: Kind.INT, ATTR_KIND: Kind.STRING,
                  ATTR_PROFILE: Kind.STRING, ATTR_PARENT: Kind.STRING}
    return DeviceSchema({driver: attributes}, {driver: frozenset({MEMORY, COMPUTE})})


# ------------------------------------------------------------------------------------ the tree
@dataclass(frozen=True)
class Lit:
    kind: Kind
    value: Value


@dataclass(frozen=True)
class DriverRef:
    pass


@dataclass(frozen=True)
class AttrRef:
    domain: str
    name: str


@dataclass(frozen=True)
class CapRef:
    domain: str
    name: str


@dataclass(frozen=True)
class MapRef:
    kind: Kind
    domain: str


@dataclass(frozen=True)
class Has:
    name: str
    map: MapRef


@dataclass(frozen=True)
class InList:
    item: Node
    values: frozenset[str | int]


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class Logic:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Compare:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Method:
    name: str
    target: Node
    arg: Node


Node: TypeAlias = Lit | DriverRef | AttrRef | CapRef | MapRef | Has | InList | Not | Logic | Compare | Method

STRING_METHODS = frozenset({"startsWith", "endsWith", "contains"})
QUANTITY_METHODS = {"compareTo": Kind.INT, "isGreaterThan": Kind.BOOL, "isLessThan": Kind.BOOL}
COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
ORDERED = frozenset({Kind.STRING, Kind.INT, Kind.BOOL})
INT_MAX = (1 << 63) - 1


# ------------------------------------------------------------------------------------ tokens
@dataclass(frozen=True)
class Token:
    kind: str  # "str", "int", "ident", "op", "end"
    text: str
    value: str | int = ""


_OPERATORS = ("&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "(", ")", "[", "]", ".", ",", "-")
_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r"}


def _string(text: str, at: int) -> tuple[str, int]:
    """The string literal starting at ``at`` (a quote) and where it ends."""
    quote = text[at]
    if text.startswith(quote * 3, at):
        raise Unsupported("triple-quoted strings are not read")
    out: list[str] = []
    i = at + 1
    while i < len(text):
        char = text[i]
        if char == quote:
            return "".join(out), i + 1
        if char == "\n":
            break
        if char == "\\":
            escaped = text[i + 1:i + 2]
            if escaped not in _ESCAPES:
                raise Unsupported(f"escape \\{escaped} is not read")
            out.append(_ESCAPES[escaped])
            i += 2
        else:
            out.append(char)
            i += 1
        if len(out) > MAX_STRING_CHARS:
            raise Unsupported(f"a string literal is longer than {MAX_STRING_CHARS} characters")
    raise Unsupported("a string literal is not closed")


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``; :class:`Unsupported` for anything else (or too many)."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise Unsupported(f"the expression is {len(text)} characters long (at most {MAX_EXPRESSION_CHARS})")
    tokens: list[Token] = []
    counted = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char in " \t\r\n":
            i += 1
            continue
        if counted >= MAX_TOKENS:
            raise Unsupported(f"the expression has more than {MAX_TOKENS} tokens")
        counted += char not in "\"'," and not (char.isascii() and char.isdigit())
        if char in "\"'":
            value, end = _string(text, i)
            tokens.append(Token("str", text[i:end], value))
            i = end
        elif char.isascii() and char.isdigit():
            end = i
            while end < len(text) and text[end].isascii() and (text[end].isalnum() or text[end] == "."):
                end += 1
            word = text[i:end]
            if not word.isdigit() or len(word) > 19 or int(word) > INT_MAX:
                raise Unsupported(f"number {word[:32]!r} is not a 64-bit decimal int (the only number read)")
            tokens.append(Token("int", word, int(word)))
            i = end
        elif char.isascii() and (char.isalpha() or char == "_"):
            end = i
            while end < len(text) and text[end].isascii() and (text[end].isalnum() or text[end] == "_"):
                end += 1
            tokens.append(Token("ident", text[i:end]))
            i = end
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise Unsupported(f"character {char!r} at {i} is not read")
            tokens.append(Token("op", op))
            i += len(op)
    tokens.append(Token("end", ""))
    return tokens


# ------------------------------------------------------------------------------------ parser
def kind_of(node: Node, schema: DeviceSchema) -> Kind:
    """The static type of ``node`` (the parser builds only well-typed trees)."""
    if isinstance(node, Lit):
        return node.kind
    if isinstance(node, DriverRef):
        return Kind.STRING
    if isinstance(node, AttrRef):
        return schema.attributes[node.domain][node.name]
    if isinstance(node, CapRef):
        return Kind.QUANTITY
    if isinstance(node, MapRef):
        return node.kind
    if isinstance(node, Method):
        return QUANTITY_METHODS.get(node.name, Kind.BOOL)
    return Kind.BOOL


class _Parser:
    def __init__(self, tokens: list[Token], schema: DeviceSchema) -> None:
        self.tokens = tokens
        self.at = 0
        self.schema = schema
        self.depth = 0

    # ---------------------------------------------------------------- helpers
    def peek(self) -> Token:
        return self.tokens[self.at]

    def take(self) -> Token:
        token = self.tokens[self.at]
        if token.kind != "end":
            self.at += 1
        return token

    def expect(self, op: str) -> None:
        token = self.take()
        if token.kind != "op" or token.text != op:
            raise Unsupported(f"expected {op!r}, found {token.text[:32] or 'the end'!r}")

    def is_op(self, *ops: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text in ops

    def kind(self, node: Node) -> Kind:
        return kind_of(node, self.schema)

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Unsupported(f"the expression nests deeper than {MAX_DEPTH}")

    # ---------------------------------------------------------------- grammar
    def whole(self) -> Node:
        node = self.expression()
        if self.peek().kind != "end":
            raise Unsupported(f"unexpected {self.peek().text[:32]!r}")
        if self.kind(node) is not Kind.BOOL:
            raise Unsupported(f"the expression is of type {self.kind(node).value}, not bool")
        return node

    def expression(self) -> Node:
        self.deeper()
        node = self.logic("||", self.conjunction)
        self.depth -= 1
        return node

    def conjunction(self) -> Node:
        return self.logic("&&", self.relation)

    def logic(self, op: str, operand: Callable[[], Node]) -> Node:
        """A chain of ``op`` (left to right; its length is bounded by :data:`MAX_TOKENS`)."""
        left = operand()
        while self.is_op(op):
            self.take()
            right = operand()
            for side in (left, right):
                if self.kind(side) is not Kind.BOOL:
                    raise Unsupported(f"{op} needs bools, found {self.kind(side).value}")
            left = Logic(op, left, right)
        return left

    def relation(self) -> Node:
        left = self.unary()
        if self.peek().kind == "ident" and self.peek().text == "in":
            self.take()
            if self.is_op("["):
                return self.in_list(left)
            right = self.unary()
            if not isinstance(left, Lit) or left.kind is not Kind.STRING or not isinstance(right, MapRef):
                raise Unsupported("'in' is read only as \"<name>\" in device.attributes[...] or device.capacity[...]")
            return Has(str(left.value), right)
        if not self.is_op(*COMPARISONS):
            return left
        op = self.take().text
        right = self.unary()
        if self.is_op(*COMPARISONS):
            raise Unsupported("chained comparisons are not read")
        kinds = self.kind(left), self.kind(right)
        if kinds[0] is not kinds[1] or kinds[0] not in ORDERED:
            raise Unsupported(f"{op} between {kinds[0].value} and {kinds[1].value} is not read "
                              "(quantities compare with .compareTo)")
        return Compare(op, left, right)

    def in_list(self, item: Node) -> Node:
        """``item in [literal, ...]``: literals of ``item``'s type, string or int."""
        kind = self.kind(item)
        if kind not in (Kind.STRING, Kind.INT):
            raise Unsupported(f"'in' a list is read only for a string or int, not {kind.value}")
        self.expect("[")
        values: set[str | int] = set()
        first = True
        while not self.is_op("]"):
            if not first:
                self.expect(",")
                if self.is_op("]"):  # CEL allows a trailing comma
                    break
            first = False
            negative = self.is_op("-")
            if negative:
                self.take()
            token = self.take()
            if token.kind != ("str" if kind is Kind.STRING else "int") or (negative and token.kind != "int"):
                raise Unsupported(f"a list for {kind.value} 'in' holds only {kind.value} literals")
            values.add(-token.value if negative and isinstance(token.value, int) else token.value)
        self.expect("]")
        return InList(item, frozenset(values))

    def unary(self) -> Node:
        if self.is_op("!"):
            self.take()
            self.deeper()
            operand = self.unary()
            self.depth -= 1
            if self.kind(operand) is not Kind.BOOL:
                raise Unsupported(f"! of {self.kind(operand).value}")
            return Not(operand)
        if self.is_op("-"):
            self.take()
            token = self.take()
            if token.kind != "int":
                raise Unsupported("'-' is read only before an int literal")
            assert isinstance(token.value, int)
            return self.postfix(Lit(Kind.INT, -token.value))
        return self.postfix(self.primary())

    def primary(self) -> Node:
        token = self.take()
        if token.kind == "op" and token.text == "(":
            node = self.expression()
            self.expect(")")
            return node
        if token.kind == "str":
            return Lit(Kind.STRING, token.value)
        if token.kind == "int":
            return Lit(Kind.INT, token.value)
        if token.kind == "ident":
            if token.text in ("true", "false"):
                return Lit(Kind.BOOL, token.text == "true")
            if token.text == "device":
                return self.device()
            if token.text == "quantity":
                self.expect("(")
                text = self.take()
                self.expect(")")
                if text.kind != "str":
                    raise Unsupported("quantity() is read only with a string literal")
                try:
                    return Lit(Kind.QUANTITY, parse_quantity(text.value))
                except QuantityError as exc:
                    raise Unsupported(f"quantity({text.text[:32]}): {exc}") from None
            raise Unsupported(f"{token.text[:32]!r} is not read")
        raise Unsupported(f"unexpected {token.text[:32] or 'end'!r}")

    def name(self) -> str:
        """``.name`` or ``["name"]`` after a map."""
        if self.is_op("."):
            self.take()
            token = self.take()
            if token.kind != "ident":
                raise Unsupported("expected a name after '.'")
            return token.text
        if self.is_op("["):
            self.take()
            token = self.take()
            self.expect("]")
            if token.kind != "str":
                raise Unsupported("only a string literal may index a map")
            return str(token.value)
        raise Unsupported("expected '.' or '['")

    def device(self) -> Node:
        self.expect(".")
        field = self.take()
        if field.kind == "ident" and field.text == "driver":
            return DriverRef()
        if field.kind != "ident" or field.text not in ("attributes", "capacity"):
            raise Unsupported(f"device.{field.text[:32]} is not read")
        self.expect("[")
        domain = self.take()
        self.expect("]")
        if domain.kind != "str":
            raise Unsupported(f"device.{field.text} is read only with a string literal domain")
        known = self.schema.attributes if field.text == "attributes" else self.schema.capacity
        if domain.value not in known:
            raise Unsupported(f"domain {str(domain.value)[:64]!r} is not one whose devices the extender knows")
        map_kind = Kind.ATTRIBUTES if field.text == "attributes" else Kind.CAPACITY
        mapped = MapRef(map_kind, str(domain.value))
        if not (self.is_op("[") or (self.is_op(".") and self.tokens[self.at + 1].kind == "ident"
                                    and self.tokens[self.at + 2].text != "(")):
            return mapped
        name = self.name()
        if name not in known[mapped.domain]:
            raise Unsupported(f"{field.text[:-1] if map_kind is Kind.CAPACITY else 'attribute'} {name[:64]!r} "
                              f"of {mapped.domain} is not one the extender knows")
        return AttrRef(mapped.domain, name) if map_kind is Kind.ATTRIBUTES else CapRef(mapped.domain, name)

    def postfix(self, node: Node) -> Node:
        while self.is_op("."):
            self.take()
            method = self.take()
            if method.kind != "ident" or not self.is_op("("):
                raise Unsupported(f"member {method.text[:32]!r} is not read")
            self.take()
            if self.is_op(")"):
                raise Unsupported(f".{method.text[:32]}() is not read")
            self.deeper()
            arg = self.expression()
            self.depth -= 1
            self.expect(")")
            node = self.method(method.text, node, arg)
        return node

    def method(self, name: str, target: Node, arg: Node) -> Node:
        kinds = self.kind(target), self.kind(arg)
        if name in STRING_METHODS and kinds == (Kind.STRING, Kind.STRING):
            return Method(name, target, arg)
        if name in QUANTITY_METHODS and kinds == (Kind.QUANTITY, Kind.QUANTITY):
            return Method(name, target, arg)
        if name == "matches":
            raise Unsupported(".matches is not read (its regular expression could take exponential time here)")
        raise Unsupported(f".{name[:32]}() on {kinds[0].value} with {kinds[1].value} is not read")


# ------------------------------------------------------------------------------------ selection
@dataclass(frozen=True)
class Selection:
    """The selectors of one request, all of which a device must match; hashable, so the extender
    keeps what it found per selection."""

    texts: tuple[str, ...]
    trees: tuple[Node, ...]

    def matches(self, device: Device) -> bool:
        """Whether every selector allows ``device``; :class:`EvalError` when one fails on it."""
        return all(evaluate(tree, device) is True for tree in self.trees)

    def attribute_names(self) -> frozenset[str]:
        """The attribute names the selectors read (a device's value for any other cannot change
        the answer: the extender evaluates once per distinct set of read values)."""
        names: set[str] = set()
        stack: list[Node] = list(self.trees)
        while stack:
            node = stack.pop()
            if isinstance(node, (AttrRef, Has)):
                names.add(node.name)
            elif isinstance(node, Not):
                stack.append(node.operand)
            elif isinstance(node, InList):
                stack.append(node.item)
            elif isinstance(node, (Logic, Compare)):
                stack.extend((node.left, node.right))
            elif isinstance(node, Method):
                stack.extend((node.target, node.arg))
        return frozenset(names)

    def __str__(self) -> str:
        shown = " && ".join(f"({t})" for t in self.texts)
        return shown if len(shown) <= 120 else shown[:117] + "..."


def parse(text: object, schema: DeviceSchema) -> Node:
    """The tree of selector ``text``; :class:`Unsupported` with the reason when outside the subset."""
    if not isinstance(text, str):
        raise Unsupported("the expression is not a string")
    return _Parser(tokenize(text), schema).whole()


def selection(selectors: object, schema: DeviceSchema) -> Selection | None:
    """The :class:`Selection` of a request's ``selectors`` (the API's list of ``{cel: {expression}}``);
    None when it has none; :class:`Unsupported` when one is outside the subset."""
    if selectors is None:
        return None
    if not isinstance(selectors, list) or len(selectors) > MAX_SELECTORS:
        raise Unsupported(f"selectors is not a list of at most {MAX_SELECTORS}")
    texts: list[str] = []
    for entry in selectors:
        cel = entry.get("cel") if isinstance(entry, Mapping) else None
        text = cel.get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(text, str) or len(entry) != 1:
            raise Unsupported("a selector other than a CEL expression")
        texts.append(text)
    if not texts:
        return None
    return Selection(tuple(texts), tuple(parse(t, schema) for t in texts))


# ------------------------------------------------------------------------------------ evaluation
def _compare(op: str, left: Value, right: Value) -> bool:
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    # same kind by construction (bools order false < true in CEL, as in Python)
    if op == "<":
        return left < right  # type: ignore[operator]
    if op == "<=":
        return left <= right  # type: ignore[operator]
    if op == ">":
        return left > right  # type: ignore[operator]
    return left >= right  # type: ignore[operator]


def _logic(node: Logic, device: Device) -> bool:
    """CEL's commutative ``&&``/``||``: a decisive side wins over an error on the other."""
    decisive = node.op == "||"
    error: EvalError | None = None
    for side in (node.left, node.right):
        try:
            value = evaluate(side, device)
        except EvalError as exc:
            error = exc
            continue
        if value is decisive:
            return decisive
    if error is not None:
        raise error
    return not decisive


def evaluate(node: Node, device: Device) -> Value:
    """The value of ``node`` (a tree from :func:`parse`) for ``device``."""
    if isinstance(node, Lit):
        return node.value
    if isinstance(node, DriverRef):
        return device.driver
    if isinstance(node, AttrRef):
        found = device.attributes.get(node.domain, {}).get(node.name)
        if found is None:
            raise EvalError(f"the device has no attribute {node.domain}/{node.name}")
        return found
    if isinstance(node, CapRef):
        capacity = device.capacity.get(node.domain, {}).get(node.name)
        if capacity is None:
            raise EvalError(f"the device has no capacity {node.domain}/{node.name}")
        return capacity
    if isinstance(node, Has):
        held = device.attributes if node.map.kind is Kind.ATTRIBUTES else device.capacity
        return node.name in held.get(node.map.domain, {})
    if isinstance(node, InList):
        return evaluate(node.item, device) in node.values
    if isinstance(node, Not):
        return not evaluate(node.operand, device)
    if isinstance(node, Logic):
        return _logic(node, device)
    if isinstance(node, Compare):
        return _compare(node.op, evaluate(node.left, device), evaluate(node.right, device))
    if isinstance(node, Method):
        target, arg = evaluate(node.target, device), evaluate(node.arg, device)
        if isinstance(target, str) and isinstance(arg, str):
            return target.startswith(arg) if node.name == "startsWith" else \
                target.endswith(arg) if node.name == "endsWith" else arg in target
        assert isinstance(target, Decimal) and isinstance(arg, Decimal)
        order = (target > arg) - (target < arg)
        return order if node.name == "compareTo" else order > 0 if node.name == "isGreaterThan" else order < 0
    raise EvalError("a map is not a value")  # a bare MapRef: refused by the parser's types
