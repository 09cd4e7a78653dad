/* muser: command-line entry point. Each subcommand is a client of the
 * public API (include/muser.h) or of the tools library. */
#include "cli.h"
#include "muser.h"
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "muser %s: inference engine for Muse Glimmer GGUF models\n\n"
            "usage: muser <command> [options]   (muser <command> --help for details)\n\n"
            "commands:\n"
            "  run        generate tokens from a model (greedy at --temp 0)\n"
            "  info       print geometry, lane, tensor types and identity hashes of a GGUF\n"
            "  synth      write a deterministic random-weight Muse Glimmer GGUF\n"
            "  quantize   convert a Muse Glimmer GGUF to another weight format or mix\n"
            "  tokenize   text to token ids with the model's tokenizer\n"
            "  detokenize token ids to text\n"
            "  chat-template  render a chat template for a JSON message list\n"
            "  bench      measure prefill/decode tokens/s and memory bandwidth\n"
            "  perplexity perplexity of a text file (llama.cpp's method)\n"
            "  speculate  exact greedy speculative decoding with a DFlash assistant\n"
            "  serve      OpenAI- and llama.cpp-compatible HTTP server with continuous batching\n"
            "  kvpack     durable, sealed KV packs: save, restore, ls, verify, gc (docs/kvpack.md)\n",
            MUSER_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("muser %s\n", MUSER_VERSION);
        return 0;
    }
    static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
        {"run", cmd_run}, {"info", cmd_info}, {"synth", cmd_synth}, {"quantize", cmd_quantize},
        {"tokenize", cmd_tokenize}, {"detokenize", cmd_detokenize}, {"chat-template", cmd_chat_template},
        {"bench", cmd_bench}, {"perplexity", cmd_perplexity}, {"speculate", cmd_speculate}, {"serve", cmd_serve},
        {"kvpack", cmd_kvpack},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "muser: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
