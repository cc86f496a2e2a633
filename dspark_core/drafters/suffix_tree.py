"""A bounded-depth suffix tree (a trie of every substring of up to `depth` tokens) with occurrence counts.

The structure behind suffix decoding (Oliaro et al. 2024, arXiv 2411.04975; vLLM's `method: suffix` through
Snowflake's Arctic Inference): a node is a token string s; `count` says how many times s occurred, `cont` how many
of those occurrences had a next token, so `kid.count / node.cont` estimates P(next = kid's token | s).

* `append` grows a request's own tree token by token in O(depth): the nodes of every suffix that ends at the last
  token are kept (`_active`), and each gets the new token as a child.
* `insert` / `remove` add and take back a whole sequence (the global tree's finished outputs, FIFO): each start
  position walks `depth` tokens, so removing exactly undoes inserting and nodes whose count reaches 0 are freed;
  `drop_start` takes back one start of an appended sequence (a request's tree over a sliding window).
* `match` finds the longest suffix of a context that occurred with a continuation; `follow` walks the most frequent
  continuation while its estimated probability stays above a floor.
"""

from __future__ import annotations

from collections.abc import Sequence


class Node:
    """One token string: its occurrences and the children that continued it."""

    __slots__ = ("count", "cont", "kids")

    def __init__(self) -> None:
        self.count = 0  # occurrences of this string
        self.cont = 0  # occurrences followed by a next token (the sum of the children's counts)
        self.kids: dict[int, Node] | None = None  # next token -> its node (None for a leaf: most nodes)


class SuffixTree:
    """Every substring of up to `depth` tokens of what was appended or inserted, with counts."""

    def __init__(self, depth: int) -> None:
        if depth < 2:
            raise ValueError(f"suffix tree depth must be >= 2 (a match and a continuation), got {depth}")
        self.depth = depth
        self.root = Node()
        self.nodes = 1  # live nodes (memory bound: tests and the bench read it)
        self._active: list[Node] = []  # nodes of the suffixes ending at the last appended token, by length 1..

    def _step(self, parent: Node, tok: int, delta: int) -> Node | None:
        """parent's child `tok`, its count moved by delta (created on +1, freed at 0); None if absent on -1."""
        kids = parent.kids
        node = kids.get(tok) if kids is not None else None
        if node is None:
            if delta < 0:
                return None
            node = Node()
            if kids is None:
                parent.kids = kids = {}
            kids[tok] = node
            self.nodes += 1
        node.count += delta
        if parent is not self.root:
            parent.cont += delta
        if node.count <= 0 and kids is not None:
            del kids[tok]
            self.nodes -= 1
        return node

    def append(self, tokens: Sequence[int]) -> None:
        """Extend the appended sequence by `tokens` (a request's prompt, then its output as it is committed).
        `_step(parent, tok, +1)` inlined: each committed token moves `depth` nodes, every round, for every request."""
        root, keep = self.root, self.depth - 1
        for tok in tokens:
            active = []
            for parent in [root, *self._active[:keep]]:
                kids = parent.kids
                if kids is None:
                    parent.kids = kids = {}
                node = kids.get(tok)
                if node is None:
                    node = kids[tok] = Node()
                    self.nodes += 1
                node.count += 1
                if parent is not root:
                    parent.cont += 1
                active.append(node)
            self._active = active

    def _walk(self, path: Sequence[int], delta: int) -> None:
        """Move the count of every prefix of `path` (one start's substrings) by delta."""
        node: Node | None = self.root
        for tok in path:
            node = self._step(node, tok, delta)  # type: ignore[arg-type]
            if node is None:
                break

    def insert(self, seq: Sequence[int], delta: int = 1) -> None:
        """Count every substring of `seq` of up to `depth` tokens (delta -1: take them back, freeing empty nodes)."""
        for start in range(len(seq)):
            self._walk(seq[start : start + self.depth], delta)

    def remove(self, seq: Sequence[int]) -> None:
        """Undo `insert(seq)`."""
        self.insert(seq, -1)

    def drop_start(self, seq: Sequence[int], start: int) -> None:
        """Take back the substrings of the appended sequence `seq` that begin at `start`: a request's tree indexes a
        sliding window. Only a start at least `depth` tokens before the end: its substrings are all counted and no
        longer grow with the next token."""
        if start > len(seq) - self.depth:
            raise ValueError(f"start {start} is within {self.depth} tokens of the end ({len(seq)})")
        self._walk(seq[start : start + self.depth], -1)

    def match(self, context: Sequence[int], longest: int) -> tuple[Node, int] | None:
        """The node of the longest suffix of `context` (at most `longest` tokens) that occurred with a next
        token, and its length; None when not even the last token did."""
        n = len(context)
        for k in range(min(longest, n), 0, -1):
            node: Node | None = self.root
            for tok in context[n - k :]:
                kids = node.kids  # type: ignore[union-attr]
                node = kids.get(tok) if kids is not None else None
                if node is None:
                    break
            if node is not None and node.cont > 0:
                return node, k
        return None

    def match_last(self, longest: int) -> tuple[Node, int] | None:
        """`match` of the appended sequence itself (a request's tree), read off the nodes `append` keeps for the
        suffixes ending at its last token: O(depth) where `match` walks O(depth^2). The window's dropped starts
        never reach these nodes (`drop_start` takes only starts `depth` or more tokens before the end)."""
        active = self._active
        for k in range(min(longest, len(active)), 0, -1):
            node = active[k - 1]
            if node.cont > 0:
                return node, k
        return None

    @staticmethod
    def follow(node: Node, limit: int, min_prob: float) -> tuple[list[int], list[float], list[int]]:
        """Up to `limit` tokens of the most frequent continuation from `node` (ties: the smaller token id), each
        with its conditional probability kid.count / node.cont and that ratio's support node.cont, while the
        running product stays >= min_prob."""
        toks: list[int] = []
        probs: list[float] = []
        supports: list[int] = []
        joint = 1.0
        while len(toks) < limit and node.kids and node.cont > 0:
            tok, kid = max(node.kids.items(), key=lambda kv: (kv[1].count, -kv[0]))
            p = kid.count / node.cont
            if joint * p < min_prob:
                break
            joint *= p
            toks.append(tok)
            probs.append(p)
            supports.append(node.cont)
            node = kid
        return toks, probs, supports


def expected_accepted(probs: Sequence[float]) -> float:
    """sum_k prod_{j<=k} probs[j]: the expected accepted length of a draft whose token k holds with probability
    probs[k] once the ones before it did (suffix's frequency ratios, DSpark's calibrated confidences)."""
    total, joint = 0.0, 1.0
    for p in probs:
        joint *= p
        total += joint
    return total
