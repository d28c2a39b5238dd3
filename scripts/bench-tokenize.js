// Times the HuggingFace tokenizers Node binding on the parity corpus
// (each string encoded on its own, as the Go benchmark does) and prints
// "<model> <MB/s>" lines. Usage: node bench-tokenize.js <repo-root> <model>...
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [root, ...models] = process.argv.slice(2);
  const td = path.join(root, 'testdata', 'tokenizers');
  const corpus = JSON.parse(fs.readFileSync(path.join(td, 'corpus.json'), 'utf8'));
  const bytes = corpus.reduce((n, s) => n + Buffer.byteLength(s, 'utf8'), 0);
  for (const model of models) {
    const tk = Tokenizer.fromFile(path.join(td, 'models', model, 'tokenizer.json'));
    for (const s of corpus) await tk.encode(s, null, { addSpecialTokens: false }); // warm up
    let rounds = 0;
    const start = process.hrtime.bigint();
    let elapsed = 0;
    while (elapsed < 3e9) {
      for (const s of corpus) await tk.encode(s, null, { addSpecialTokens: false });
      rounds++;
      elapsed = Number(process.hrtime.bigint() - start);
    }
    console.log(`${model} ${(bytes * rounds / (elapsed / 1e9) / 1e6).toFixed(2)}`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
