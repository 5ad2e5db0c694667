// OpenAI's tokenizer as independent truth for kvq's tiktoken reader: npm js-tiktoken, which ships
// the cl100k_base ranks (scripts/node-truth installs it).
//   node tiktoken_truth.js --write-ranks OUT     -> OUT: cl100k_base as a ranks file ("base64 rank" lines)
//   node tiktoken_truth.js REQUEST.json          -> {"ids": [[...], ...]} on stdout
//   node tiktoken_truth.js --bench FILE REPEATS  -> {"bytes":..,"tokens":..,"seconds":..} (best of REPEATS)
// REQUEST: {"special": bool (true: special-token strings become their ids, as kvq's
// --special-tokens special; false: plain text), "items": [{"text": s} | {"file": path}]}.
// Files are read as UTF-8 (invalid bytes -> U+FFFD). Needs NODE_PATH to hold the npm cache's node_modules.
'use strict';
const fs = require('fs');
const { Tiktoken } = require('js-tiktoken/lite');
const cl100k = require('js-tiktoken/ranks/cl100k_base');
const ranks = cl100k.default || cl100k;

function main() {
  const argv = process.argv.slice(2);
  if (argv[0] === '--write-ranks') {
    // js-tiktoken stores the ranks compressed: each line "! FIRST tok tok ..." gives consecutive
    // ranks from FIRST to base64 tokens.
    const lines = [];
    for (const row of ranks.bpe_ranks.split('\n')) {
      if (!row) continue;
      const [, first, ...toks] = row.split(' ');
      const base = Number.parseInt(first, 10);
      toks.forEach((t, i) => lines.push([base + i, t]));
    }
    lines.sort((a, b) => a[0] - b[0]);
    fs.writeFileSync(argv[1], lines.map(([r, t]) => t + ' ' + r).join('\n') + '\n');
    process.stdout.write(JSON.stringify({ ranks: lines.length, pat_str: ranks.pat_str, special_tokens: ranks.special_tokens }) + '\n');
    return;
  }
  if (argv[0] === '--bench') {
    const enc = new Tiktoken(ranks);
    const text = fs.readFileSync(argv[1], 'utf8');
    const bytes = Buffer.byteLength(text, 'utf8');
    enc.encode(text.slice(0, 1000));  // warm-up
    let best = Infinity, n = 0;
    for (let r = 0; r < Number(argv[2] || 3); ++r) {
      const t0 = process.hrtime.bigint();
      n = enc.encode(text, 'all').length;
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    }
    process.stdout.write(JSON.stringify({ bytes, tokens: n, seconds: best }) + '\n');
    return;
  }
  const req = JSON.parse(fs.readFileSync(argv[0], 'utf8'));
  const enc = new Tiktoken(ranks);
  const ids = [];
  for (const it of req.items) {
    const text = it.file !== undefined ? fs.readFileSync(it.file, 'utf8') : it.text;
    ids.push(req.special ? enc.encode(text, 'all') : enc.encode(text, [], []));
  }
  process.stdout.write(JSON.stringify({ ids }) + '\n');
}
main();
