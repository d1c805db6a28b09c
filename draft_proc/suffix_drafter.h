/* The suffix kind of Drafter: model-free drafting from text already seen. Output that
 * repeats its input (code edits, quoting, lists, templated answers) is predicted for free
 * by finding where the context's last tokens occurred before and proposing what followed
 * them (prompt lookup / SuffixDecoding). It costs microseconds a round, so a decode can
 * ask it every round and verify only what looks likely (DESIGN.md §2, "Suffix drafter").
 *
 * Where it looks: the committed context (prompt and output so far) and an optional corpus
 * of token ids fixed at creation. Each earlier occurrence of the context's last one or two
 * tokens is a match, weighted by how far back it agrees with the context (its match
 * length, at most SUFFIX_MATCH_MAX). The continuations of the best SUFFIX_OCC_MAX matches
 * form a trie; the pool is that trie (breadth first, children by weight, the pool's shape
 * limits), with log q = log(weight of the child / (weight of its parent + 1)), so a long
 * match scores close to certain and a one-token match well below it. */
#ifndef ROOTSPEC_SUFFIX_DRAFTER_H
#define ROOTSPEC_SUFFIX_DRAFTER_H
#include "drafter.h"
#include <stddef.h>

#define SUFFIX_MATCH_MAX 32 /* match lengths are counted up to this */
#define SUFFIX_OCC_MAX 64   /* matches that feed one pool */

/* A suffix drafter over token ids [0, vocab). corpus (n_corpus ids, may be NULL / 0) is
 * copied; name labels it in messages ("suffix" when NULL). RS_EINVAL for a corpus id
 * outside the vocabulary. */
int drafter_suffix_create(int vocab, const int *corpus, size_t n_corpus, const char *name,
                          Drafter **out, RsErr *e);

/* An index shared across requests (a server's earlier outputs): the last max_tokens
 * tokens of the documents added, oldest out first, each document followed by a separator
 * that counts as a token and that no match crosses. Drafters that share it search it as
 * they search their corpus; drafts are proposals only, so what it holds never changes an
 * output, only how many tokens a round accepts. Safe to add to while drafters read it
 * (a reader-writer lock: a round reads, a finished request writes). */
typedef struct SuffixIndex SuffixIndex;

#define SUFFIX_INDEX_MAX (1 << 26)

/* RS_EINVAL for max_tokens outside 2..SUFFIX_INDEX_MAX. */
int suffix_index_create(size_t max_tokens, SuffixIndex **out, RsErr *e);
/* Clears *ix; no drafter may share it any more. */
void suffix_index_destroy(SuffixIndex **ix);
/* Appends one document (ids inside the drafters' vocabulary: the caller's contract). */
void suffix_index_add(SuffixIndex *ix, const int *tokens, size_t n);
/* Tokens held now (separators included), at most max_tokens. */
size_t suffix_index_tokens(SuffixIndex *ix);
/* d (a suffix drafter; RS_EINVAL for any other kind) also searches ix from its next round
 * on; ix must outlive d's use of it. NULL stops sharing. */
int drafter_suffix_share(Drafter *d, SuffixIndex *ix, RsErr *e);

#endif
