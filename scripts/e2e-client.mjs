// The official OpenAI Node SDK against the router in front of simulated
// pods: completions and chat, streaming and not, models, and an error.
// Usage: node e2e-client.mjs BASE_URL MODEL   (exits non-zero on failure)
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });
const fail = (msg) => { console.error("FAIL: " + msg); process.exit(1); };
const prompt = "You are a helpful assistant for an operator of a vLLM fleet. ".repeat(20);

const models = await client.models.list();
if (!models.data.some((m) => m.id === model)) fail(`models.list lacks ${model}`);
console.log(`ok   models.list: ${models.data.map((m) => m.id).join(", ")}`);

const c = await client.completions.create({ model, prompt, max_tokens: 5 });
if (!c.choices?.length || c.usage?.prompt_tokens <= 0) fail("completion: " + JSON.stringify(c));
console.log(`ok   completions: ${c.usage.prompt_tokens} prompt tokens, ${c.usage.prompt_tokens_details?.cached_tokens ?? "?"} cached`);

let text = "", chunks = 0, usage = null;
const cs = await client.completions.create({ model, prompt, max_tokens: 5, stream: true, stream_options: { include_usage: true } });
for await (const ch of cs) { chunks++; text += ch.choices?.[0]?.text ?? ""; if (ch.usage) usage = ch.usage; }
if (chunks < 2 || !usage) fail(`streamed completion: ${chunks} chunks, usage ${JSON.stringify(usage)}`);
console.log(`ok   completions stream: ${chunks} chunks, ${usage.prompt_tokens_details?.cached_tokens ?? "?"} cached tokens`);

const messages = [{ role: "system", content: prompt }, { role: "user", content: "How full is the KV cache?" }];
const r = await client.chat.completions.create({ model, messages, max_tokens: 5 });
if (!r.choices?.[0]?.message || r.usage?.prompt_tokens <= 0) fail("chat: " + JSON.stringify(r));
console.log(`ok   chat: ${r.usage.prompt_tokens} prompt tokens, ${r.usage.prompt_tokens_details?.cached_tokens ?? "?"} cached`);

chunks = 0; usage = null; let content = "";
const rs = await client.chat.completions.create({ model, messages, max_tokens: 5, stream: true, stream_options: { include_usage: true } });
for await (const ch of rs) { chunks++; content += ch.choices?.[0]?.delta?.content ?? ""; if (ch.usage) usage = ch.usage; }
if (chunks < 2 || !usage) fail(`streamed chat: ${chunks} chunks, usage ${JSON.stringify(usage)}`);
console.log(`ok   chat stream: ${chunks} chunks, ${usage.prompt_tokens_details?.cached_tokens ?? "?"} cached tokens`);

try {
  await client.chat.completions.create({ model: "no-such-model", messages, max_tokens: 1 });
  fail("unknown model accepted");
} catch (e) {
  if (!(e instanceof OpenAI.NotFoundError)) fail("unknown model: " + e);
  console.log(`ok   unknown model: ${e.status} ${e.message}`);
}
try {
  await client.completions.create({ model, prompt: [1, -1], max_tokens: 1 });
  fail("negative token id accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError)) fail("bad prompt: " + e);
  console.log(`ok   bad request: ${e.status} ${e.message}`);
}
console.log("e2e-client: all checks passed");
