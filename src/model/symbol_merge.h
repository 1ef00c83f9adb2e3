// The merge loop that the BPE and SentencePiece tokenizers share (internal to model/).
#pragma once

#include <cstdint>
#include <vector>

namespace kvc::model {

// Merges a word's symbols (a linked list through prev and next, -1 at the ends; len 0 once merged
// away) best pair first: consider(left, right) pushes the pair of adjacent symbols onto the agenda
// when they merge into something the vocabulary knows, with their merged len; a pair that an
// earlier merge made stale is skipped when it comes up.
template <class Symbol, class Agenda, class Consider>
void merge_symbols(std::vector<Symbol>& symbols, Agenda& agenda, const Consider& consider) {
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i, i + 1);
  while (!agenda.empty()) {
    const auto p = agenda.top();
    agenda.pop();
    Symbol& l = symbols[p.left];
    Symbol& r = symbols[p.right];
    if (l.len == 0 || r.len == 0 || l.next != p.right || l.len + r.len != p.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = p.left;
    consider(l.prev, p.left);
    consider(p.left, l.next);
  }
}

}  // namespace kvc::model
