/* JSON Schema -> GBNF, following llama.cpp's converter
 * (examples/json_schema_to_grammar.py, mirrored by
 * common/json-schema-to-grammar.cpp): same rule names, same rule bodies, same
 * primitive rules (space, char, string, number, ...), rules sorted by name,
 * one per line, root rule "root". For the schemas it accepts, the output is
 * byte-for-byte what the Python converter prints, except for the deliberate
 * fixes listed below.
 *
 * Supported: type (string, number, integer, boolean, null, object, array, and
 * arrays of these), properties / required / additionalProperties (true, false
 * or a schema; required properties first, then optional ones, each in schema
 * order), enum, const, items (schema or draft-7 tuple array), prefixItems,
 * minItems / maxItems, anyOf / oneOf (oneOf is treated as anyOf, as llama
 * does), allOf of object schemas (their properties merged; properties of an
 * anyOf inside allOf become optional) or of string enums (intersected), $ref
 * to "#/..." inside the document (recursion allowed), format date / time /
 * date-time / uuid / uuid1..uuid5, minLength / maxLength on strings, anchored
 * patterns "^...$", minimum / maximum / exclusiveMinimum / exclusiveMaximum
 * on integers (|bound| <= 9999999999999999).
 *
 * Ignored as annotations: title, description, $schema, $comment, examples,
 * default, deprecated, readOnly, writeOnly, $id (root only), and the
 * definition containers $defs / definitions (checked when referenced).
 * Everything else that could constrain a value and would not be honoured
 * by the grammar is refused: unknown keywords, keywords llama's converter
 * silently drops (multipleOf, minimum on "number", format "email",
 * minLength next to pattern, ...), remote or non-"#/" $ref, boolean
 * sub-schemas, unanchored patterns, and pattern syntax that llama translates
 * into a wrong or JSON-breaking grammar ('.', character classes that can
 * match '"' '\' or control characters, \d and other escapes, lookarounds).
 * Keywords that only constrain other types than the ones the rule produces
 * are ignored, as JSON Schema says (e.g. minLength next to type integer).
 *
 * Deliberate differences from llama.cpp (each fixes a grammar that would let
 * the model produce invalid JSON or a value the schema rejects):
 *  - integers with only a minimum whose digits llama's one-sided
 *    construction gets wrong (e.g. minimum 100 accepted 10..99), and with
 *    only a negative maximum (llama allowed "-05"), get llama's two-sided
 *    construction up to the 16-digit limit of its integer rule instead;
 *  - the "any other key" rule of additionalProperties next to properties
 *    starts with [^"\\\x7F\x00-\x1F...] instead of [^"...], so an extra key
 *    cannot begin with a raw backslash or control character;
 *  - a pattern that repeats a group able to match "" ("(a|)+", "(a?)*",
 *    "(a*){2,}") repeats the group's non-empty part with minimum 0 instead
 *    (same language); llama's text is left recursion GBNF parsers refuse;
 *  - next to additionalProperties, a declared name longer than 200
 *    characters would make llama's "any other key" rule nest one group per
 *    character, past the GBNF parser's 256 levels; muser writes one flat
 *    rule per node of the names' trie instead, which refuses exactly the
 *    declared names (as written, escapes not decoded);
 *  - "items": false next to prefixItems (llama crashes) gives the tuple;
 *  - $ref pointers are unescaped (~0, ~1) as RFC 6901 says.
 * Refused where llama would silently accept: see above. JSON numbers beyond
 * 64-bit integers are refused (jansson cannot hold them).
 *
 * Inherited from llama, on purpose (the grammar is narrower than the schema
 * or follows llama's reading of it): a schema without "type" but with
 * "properties" yields objects only, {} yields objects only, oneOf acts as
 * anyOf, prefixItems tuples allow no extra items, extra keys cannot be
 * proper prefixes of declared names (of at most 200 characters), formats follow llama's rules (a
 * "date" may be 2023-02-31). Sub-schemas are checked when the grammar uses
 * them; keywords that are ignored for the produced types are not validated. */
#ifndef MUSER_GRAMMAR_JSON_SCHEMA_H
#define MUSER_GRAMMAR_JSON_SCHEMA_H
#include "util/common.h"
#include <stddef.h>

/* Convert len bytes of JSON Schema text into GBNF. Returns malloc'd,
 * NUL-terminated grammar text (free() it), or NULL with err naming the
 * refused keyword and its JSON pointer (e.g. "json schema: unsupported
 * keyword \"multipleOf\" at /properties/n/multipleOf"). */
char *mu_json_schema_to_gbnf(const char *schema_json, size_t len, mu_error *err);

#endif
