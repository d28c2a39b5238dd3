// Regenerates testdata/tokenizers/ref/<model>.add{0,1}.jsonl with the
// official HuggingFace tokenizers Node binding (see parity-refs.sh).
// Usage: node parity-refs.js <repo-root> <model>...
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [root, ...models] = process.argv.slice(2);
  const td = path.join(root, 'testdata', 'tokenizers');
  const corpus = JSON.parse(fs.readFileSync(path.join(td, 'corpus.json'), 'utf8'));
  for (const model of models) {
    const tk = Tokenizer.fromFile(path.join(td, 'models', model, 'tokenizer.json'));
    for (const add of [0, 1]) {
      const lines = [];
      for (const text of corpus) {
        const enc = await tk.encode(text, null, { addSpecialTokens: add === 1 });
        lines.push(JSON.stringify(Array.from(enc.getIds())) + '\n');
      }
      const out = path.join(td, 'ref', `${model}.add${add}.jsonl`);
      fs.writeFileSync(out, lines.join(''));
      console.error(`parity-refs: wrote ${out} (${lines.length} lines)`);
    }
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
