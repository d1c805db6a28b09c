/* Byte-level BPE tokenizer (GPT-2 style, as used by Llama-3, SmolLM2, Qwen) loaded from
 * GGUF metadata (tokenizer.ggml.*) or a Hugging Face tokenizer.json, plus the chat
 * templates the engine supports. */
#ifndef ROOTSPEC_TOKENIZER_H
#define ROOTSPEC_TOKENIZER_H
#include "util.h"
#include <stdint.h>

typedef struct Tokenizer Tokenizer;
struct Model;

typedef enum {
    CHAT_NONE = 0,
    CHAT_SMOLLM2, /* ChatML with SmolLM2's default system prompt */
    CHAT_QWEN2,   /* Qwen2.5 ChatML with its default system prompt */
    CHAT_QWEN3,   /* ChatML, non-thinking: empty <think></think> block after the prompt */
    CHAT_LLAMA3,  /* <|start_header_id|> ... <|eot_id|> */
} ChatTemplate;

/* From the model's own source (GGUF metadata or the directory's tokenizer.json). A
 * random-weight model ("random:...") has none: RS_OK with *out NULL. */
int tokenizer_load_model(const struct Model *m, Tokenizer **out, RsErr *e);
/* From a tokenizer.json file. */
int tokenizer_load_json(const char *path, Tokenizer **out, RsErr *e);
void tokenizer_destroy(Tokenizer **t);

int tokenizer_vocab_size(const Tokenizer *tok);
int tokenizer_eos_id(const Tokenizer *tok); /* -1 if none */
int tokenizer_bos_id(const Tokenizer *tok); /* -1 if none */
/* Whether the model's reference tokenizer adds BOS when encoding a prompt. */
int tokenizer_add_bos(const Tokenizer *tok);
/* True for EOS and end-of-turn tokens (<|im_end|>, <|eot_id|>, <|endoftext|> as declared). */
int tokenizer_is_eog(const Tokenizer *tok, int id);
/* 64-bit FNV-1a over the vocabulary strings and merges: equal hashes = same tokenizer. */
uint64_t tokenizer_hash(const Tokenizer *tok);
/* What HELLO compares: tokenizer_hash(tok), or for tok == NULL (a model without a tokenizer) a
 * hash of the vocabulary size alone, so random models of one vocabulary agree. */
uint64_t tokenizer_identity(const Tokenizer *tok, int vocab_size);

/* Encodes UTF-8 text. Special tokens written literally in the text (e.g. "<|im_start|>")
 * become their ids, as HF tokenizers do by default. Does not add BOS (callers decide with
 * tokenizer_add_bos). *ids is malloc'd; caller frees. */
int tokenizer_encode(const Tokenizer *tok, const char *text, int **ids, int *n, RsErr *e);
/* The same, except where plain (NULL, or one flag per byte of text) marks bytes: a special
 * token overlapping one is not matched there, so it is text like any other and encodes to
 * the tokens of the bytes it spells. Text without special tokens in the marked bytes encodes
 * exactly as with tokenizer_encode. chat_render marks a conversation's contents so. */
int tokenizer_encode_plain(const Tokenizer *tok, const char *text, const uint8_t *plain,
                           int **ids, int *n, RsErr *e);

/* Raw bytes of one token (byte-level decoded). Returns the byte count written into buf
 * (at most cap), or -1 for an out-of-range id. Special tokens decode to their text. */
int tokenizer_token_bytes(const Tokenizer *tok, int id, char *buf, int cap);
/* The same bytes in place, however long: the tokenizer owns them (valid until
 * tokenizer_destroy). NULL for an out-of-range id. */
const char *tokenizer_token_view(const Tokenizer *tok, int id, size_t *len);
/* What token id prints: its bytes (tokenizer_token_view), or for an id the tokenizer does
 * not have (a model vocabulary padded past the tokenizer) U+FFFD, the replacement character,
 * so such an id is seen rather than silently dropped. *len gets the byte count. */
const char *tokenizer_token_text(const Tokenizer *tok, int id, size_t *len);
/* Decodes a whole sequence to a malloc'd NUL-terminated string; caller frees. */
char *tokenizer_decode(const Tokenizer *tok, const int *ids, int n);

/* Picks the template for a model (GGUF tokenizer.chat_template / general.name or the
 * directory's tokenizer_config.json); CHAT_NONE if unrecognised. */
ChatTemplate chat_template_for_model(const struct Model *m);
/* Builds the prompt string exactly as transformers' apply_chat_template(
 * [{"role":"user","content":user}], add_generation_prompt=True) does. Caller frees. */
char *chat_build_prompt(ChatTemplate tpl, const char *user);

/* One turn of a conversation: role "system" (first turn only), "user" or "assistant". */
typedef struct {
    const char *role;
    const char *content;
} ChatMsg;
/* The shapes every template renders: system (first only), user and assistant turns,
 * ending with a user turn; RS_EINVAL naming the turn otherwise. */
int chat_conversation_check(const ChatMsg *m, int n, RsErr *e);
/* The same as chat_build_prompt for a conversation of n turns ending with the user's (the OpenAI API's
 * messages). NULL with e set: RS_EINVAL for another shape (named), RS_EUNSUPPORTED for
 * several turns without a template. Caller frees. */
char *chat_build_conversation(ChatTemplate tpl, const ChatMsg *m, int n, RsErr *e);
/* chat_build_conversation's text, and with plain != NULL a malloc'd flag per byte of it
 * (the caller frees): 1 where the byte is a turn's content, the caller's words; 0 where it
 * is the template's own (markers, roles, a default system prompt). tokenizer_encode_plain
 * then keeps content that spells a special token (<|im_end|>, ...) from forging turns. */
char *chat_render(ChatTemplate tpl, const ChatMsg *m, int n, uint8_t **plain, RsErr *e);

#endif
