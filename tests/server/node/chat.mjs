// chat.mjs — a four-turn conversation through the official OpenAI Node
// client (npm package `openai`) against a running `kvsieve serve`: every
// turn streamed with chat.completions.create({stream: true}) and
// stream_options.include_usage, its answer sent back as the assistant's turn
// of the next request, as any chat UI does.  Each turn must complete (a role
// chunk, text, a finish reason, usage with a growing prompt); the
// deprecated function role must come back as the client's BadRequestError.
//
// usage.prompt_tokens_details.cached_tokens (OpenAI's field for prompt
// tokens served from a prefix cache) is checked when present: an integer in
// [0, prompt_tokens], never decreasing from turn to turn.  Growth (each
// follow-up reuses more than the turn before) is required only when the
// cache is known to be on: EXPECT_CACHED_TOKENS=1 in the environment, or
// the server's /v1/models entry saying kvsieve.prefix_cache is true.
// Usage: node chat.mjs BASE_URL API_KEY   (run by ../openai_node_chat.sh)
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const models = [];
for await (const m of await client.models.list()) models.push(m);
const model = models[0].id;
const expectCache = process.env.EXPECT_CACHED_TOKENS === '1' || models[0]?.kvsieve?.prefix_cache === true;

// A shared document long enough to fill several KV pages, then questions.
const doc = Array.from({ length: 24 }, (_, i) =>
  `Line ${i + 1}: the quiet farmer walks near the old bridge and counts ${i + 7} sheep.`).join('\n');
const messages = [
  { role: 'system', content: 'You answer questions about the document the user gives.' },
  { role: 'developer', content: 'Keep answers short.' },
];
// Each follow-up is longer than a KV page (32 tokens), so every turn's prompt
// ends at least one whole cached block past the turn before: the cache keeps
// whole pages of prefilled rows, and the answers (decoded rows) are prefilled
// again by the next turn.
const questions = [
  [{ type: 'text', text: `Here is a document.\n${doc}\n` }, { type: 'text', text: 'How many sheep on line 3?' }],
  'And on line 10? Please read the line again carefully, count the sheep the farmer counts there, and answer with the number only, as before.',
  'Which line has the most sheep? Look at every line from the first to the last, compare the numbers of sheep, and answer with the line number only.',
  'Thank you. Now summarise the whole document in one short sentence that names the farmer, the bridge and how the number of sheep changes.',
];

let lastPrompt = 0, lastCached = -1;
const cachedSeen = [];
for (let turn = 0; turn < questions.length; turn++) {
  messages.push({ role: 'user', content: questions[turn] });
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let content = '', role = null, finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta?.role) role = c.delta.role;
    content += c.delta?.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  const t = `turn ${turn + 1}`;
  assert.ok(chunks >= 2, `${t}: streamed ${chunks} chunks`);
  assert.equal(role, 'assistant', `${t}: role chunk`);
  assert.ok(finish === 'stop' || finish === 'length', `${t}: finish_reason ${finish}`);
  assert.ok(usage, `${t}: usage chunk (stream_options.include_usage)`);
  assert.ok(usage.completion_tokens >= 0 && usage.completion_tokens <= 12, `${t}: completion_tokens ${usage.completion_tokens}`);
  assert.ok(usage.prompt_tokens > lastPrompt, `${t}: prompt_tokens ${usage.prompt_tokens} after ${lastPrompt}`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, `${t}: total_tokens`);
  const cached = usage.prompt_tokens_details?.cached_tokens;
  if (cached !== undefined && cached !== null) {
    assert.ok(Number.isInteger(cached) && cached >= 0 && cached <= usage.prompt_tokens,
      `${t}: cached_tokens ${cached} of ${usage.prompt_tokens}`);
    assert.ok(cached >= lastCached, `${t}: cached_tokens fell from ${lastCached} to ${cached}`);
    if (expectCache && turn > 0) assert.ok(cached > lastCached && cached >= lastPrompt / 2,
      `${t}: cached_tokens ${cached} did not grow past ${lastCached} (previous prompt ${lastPrompt} tokens)`);
    lastCached = cached;
  } else {
    assert.ok(!expectCache, `${t}: the cache is on but usage has no prompt_tokens_details.cached_tokens`);
  }
  cachedSeen.push(cached ?? '-');
  lastPrompt = usage.prompt_tokens;
  messages.push({ role: 'assistant', content });
}

// the deprecated function role comes back as a clear 400 (tool messages: tools.mjs)
await assert.rejects(
  client.chat.completions.create({ model, max_tokens: 4,
    messages: [...messages, { role: 'function', name: 'f', content: '42' }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.code === 'unsupported' &&
         e.param === `messages[${messages.length}].role`);

console.log(`openai node client: 4 streamed turns, prompt tokens up to ${lastPrompt}, cached_tokens per turn: ` +
            `${cachedSeen.join(', ')}${expectCache ? ' (cache expected on)' : ''}`);
