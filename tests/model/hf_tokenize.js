// Hugging Face tokenizers (Rust, Node bindings) as independent truth for kvq's tokenizer.json.
//   node hf_tokenize.js REQUEST.json          -> {"ids": [[...], ...], "special": [...]} on stdout
//   node hf_tokenize.js --bench TOKENIZER FILE REPEATS -> {"mb_per_s": .., "tokens": ..} on stdout
// REQUEST: {"tokenizer": path, "encode_special": bool (true: special-token strings stay text, as
// kvq's --special-tokens text), "add_special_tokens": bool (post-processor, i.e. the BOS),
// "items": [{"text": s} | {"file": path}]}. Files are read as UTF-8 (invalid bytes -> U+FFFD).
// Needs NODE_PATH to hold the node_modules of scripts/node-truth.
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

function load(path, encodeSpecial) {
  if (!encodeSpecial) return Tokenizer.fromFile(path);
  // HF's encode_special_tokens, which the Node bindings do not expose: the same file with each
  // special added token's content replaced by a string no text holds (private-use characters)
  // encodes their strings as ordinary text. Replaced, not removed: HF renumbers the added tokens
  // that follow a gap.
  const j = JSON.parse(fs.readFileSync(path, 'utf8'));
  for (const t of j.added_tokens || []) if (t.special) t.content = '\uE000\uE001kvq-unmatchable-' + t.id + '\uE002';
  return Tokenizer.fromString(JSON.stringify(j));
}

async function main() {
  const argv = process.argv.slice(2);
  if (argv[0] === '--bench') {
    const tok = Tokenizer.fromFile(argv[1]);
    const text = fs.readFileSync(argv[2], 'utf8');
    const bytes = Buffer.byteLength(text, 'utf8');
    const reps = Number(argv[3] || 3);
    await tok.encode(text.slice(0, 1000), null, { addSpecialTokens: false });  // warm-up
    let best = Infinity, n = 0;
    for (let r = 0; r < reps; ++r) {
      const t0 = process.hrtime.bigint();
      const e = await tok.encode(text, null, { addSpecialTokens: false });
      const s = Number(process.hrtime.bigint() - t0) / 1e9;
      n = e.getIds().length;
      best = Math.min(best, s);
    }
    process.stdout.write(JSON.stringify({ bytes, tokens: n, seconds: best, mb_per_s: bytes / 1e6 / best }) + '\n');
    return;
  }
  const req = JSON.parse(fs.readFileSync(argv[0], 'utf8'));
  const tok = load(req.tokenizer, !!req.encode_special);
  const ids = [];
  for (const it of req.items) {
    const text = it.file !== undefined ? fs.readFileSync(it.file, 'utf8') : it.text;
    const e = await tok.encode(text, null, { addSpecialTokens: !!req.add_special_tokens });
    ids.push(Array.from(e.getIds()));
  }
  process.stdout.write(JSON.stringify({ ids }) + '\n');
}
main().catch((e) => { process.stderr.write(String(e && e.stack || e) + '\n'); process.exit(1); });
