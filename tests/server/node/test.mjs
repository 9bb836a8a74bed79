// test.mjs — the official OpenAI Node client (npm package `openai`) against a
// running `kvsieve serve`: models, completions and chat, non-streaming and
// streaming, usage counts, the kvsieve extension object passed through the
// client, and errors surfacing as the client's own error classes.
// Usage: node test.mjs BASE_URL API_KEY EXPECTED_TEXT   (run by ../openai_node.sh)
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const [baseURL, apiKey, expected] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const prompt = 'Once upon a time';

const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
assert.equal(ids.length, 1, 'one model');
const model = ids[0];

// completions, non-streaming: the greedy text `kvsieve run --temp 0` printed
const c = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
assert.equal(c.object, 'text_completion');
assert.equal(c.choices[0].text, expected);
assert.equal(c.choices[0].finish_reason, 'length');
assert.equal(c.usage.completion_tokens, 24);
assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + 24);

// completions, streaming
let streamed = '';
const cs = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true });
for await (const chunk of cs) streamed += chunk.choices[0]?.text ?? '';
assert.equal(streamed, expected);

// chat, non-streaming (the model has no chat template: the user text is the prompt)
const ch = await client.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }], max_tokens: 24, temperature: 0 });
assert.equal(ch.object, 'chat.completion');
assert.equal(ch.choices[0].message.role, 'assistant');
assert.equal(ch.choices[0].message.content, expected);

// chat, streaming with usage
let content = '', usage = null, role = null;
const st = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: prompt }], max_tokens: 24, temperature: 0,
  stream: true, stream_options: { include_usage: true },
});
for await (const chunk of st) {
  if (chunk.usage) usage = chunk.usage;
  const d = chunk.choices[0]?.delta;
  if (d?.role) role = d.role;
  content += d?.content ?? '';
}
assert.equal(role, 'assistant');
assert.equal(content, expected);
assert.equal(usage.completion_tokens, 24);

// a stop string ends the text before it
const s = await client.completions.create({ model, prompt, max_tokens: 60, temperature: 0, stop: ['petals'] });
assert.equal(s.choices[0].text, ', pixels unfolding like ');
assert.equal(s.choices[0].finish_reason, 'stop');

// the kvsieve extension object rides along in the body
const q = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, kvsieve: { policy: 'streaming', budget: 100 } });
assert.equal(q.choices[0].text.length > 0, true);

// errors arrive as the client's error classes, with OpenAI's error object
await assert.rejects(
  client.completions.create({ model, prompt, max_tokens: 8, kvsieve: { policy: 'no-such-policy' } }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.code === 'unknown_policy' && e.param === 'kvsieve.policy');
await assert.rejects(
  client.completions.create({ model, prompt: 'x '.repeat(400), max_tokens: 8 }),
  (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);

console.log('openai node client: all checks passed');
