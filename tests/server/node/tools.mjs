// tools.mjs — a tool-call round trip through the official OpenAI Node client
// (npm package `openai`) against a running `kvsieve serve`: the client sends
// tools, gets tool_calls back (tool_choice required, then a named function,
// so that even a tiny model makes a valid call: the server constrains the
// call to the function's parameters schema), runs the "tool" itself, sends
// the assistant's calls and the tool results back, and gets a final text
// answer; once with plain answers and once streamed (delta.tool_calls
// accumulated as clients do).  Bad tools come back as the client's
// BadRequestError naming the field.
// Usage: node tools.mjs BASE_URL API_KEY   (run by ../openai_node_tools.sh)
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const models = [];
for await (const m of await client.models.list()) models.push(m);
const model = models[0].id;

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['C', 'F'] } },
                  required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'add', description: 'Add two integers',
    parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] } } },
];
// the tools, run locally as a client would
const run = {
  get_weather: (a) => { assert.equal(typeof a.city, 'string'); assert.ok(['C', 'F'].includes(a.unit)); return `18 ${a.unit}, clear`; },
  add: (a) => { assert.ok(Number.isInteger(a.a) && Number.isInteger(a.b)); return String(a.a + a.b); },
};

// A call must be well formed: an id, a known function, JSON object arguments;
// a named call's arguments fit its function's schema.  (With "required" and
// several tools the server holds the arguments to "an object" only: the
// schema subset it enforces has no anyOf to tie a schema to each name.)
function checkCall(c, want) {
  assert.equal(c.type, 'function');
  assert.ok(typeof c.id === 'string' && c.id.length > 0, 'call id');
  assert.ok(c.function.name in run, `unknown function ${c.function.name}`);
  const args = JSON.parse(c.function.arguments);
  assert.ok(args && typeof args === 'object' && !Array.isArray(args), 'arguments are an object');
  if (!want) return 'done';
  assert.equal(c.function.name, want);
  return run[c.function.name](args);
}

// One round trip: ask with tools, answer the calls, get the final text.
async function roundTrip(stream, toolChoice, want) {
  const messages = [{ role: 'system', content: 'You can call tools.' },
                    { role: 'user', content: 'What is the weather in Paris, and what is 2 + 3?' }];
  let calls, finish, content;
  if (!stream) {
    const r = await client.chat.completions.create({ model, messages, tools, tool_choice: toolChoice,
                                                      max_tokens: 80, temperature: 0 });
    const ch = r.choices[0];
    ({ finish_reason: finish } = ch);
    calls = ch.message.tool_calls;
    content = ch.message.content;
  } else {
    const s = await client.chat.completions.create({ model, messages, tools, tool_choice: toolChoice,
                                                      max_tokens: 80, temperature: 0, stream: true });
    calls = [];
    content = '';
    for await (const chunk of s) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta?.content ?? '';
      for (const d of c.delta?.tool_calls ?? []) { // accumulate by index, as the SDK's helpers do
        const t = calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
        if (d.id) t.id = d.id;
        if (d.function?.name) t.function.name += d.function.name;
        if (d.function?.arguments) t.function.arguments += d.function.arguments;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(finish, 'tool_calls', `finish_reason ${finish}`);
  assert.equal(calls.length, 1, 'one forced call');
  const results = calls.map((c) => checkCall(c, want));
  // the assistant's calls and the tools' results go back; the final answer is text
  messages.push({ role: 'assistant', content: content || null, tool_calls: calls });
  calls.forEach((c, i) => messages.push({ role: 'tool', tool_call_id: c.id, content: results[i] }));
  const fin = await client.chat.completions.create({ model, messages, tools, max_tokens: 16, temperature: 0 });
  const f = fin.choices[0];
  assert.ok(['stop', 'length', 'tool_calls'].includes(f.finish_reason));
  if (f.finish_reason !== 'tool_calls') assert.equal(typeof f.message.content, 'string');
  assert.ok(fin.usage.prompt_tokens > 0);
  return `${calls[0].function.name}(${calls[0].function.arguments}) -> ${results[0]}; final ${f.finish_reason}`;
}

const out = [];
out.push(await roundTrip(false, 'required', null));
out.push(await roundTrip(false, { type: 'function', function: { name: 'add' } }, 'add'));
out.push(await roundTrip(true, { type: 'function', function: { name: 'get_weather' } }, 'get_weather'));
out.push(await roundTrip(true, 'required', null));

// tool_choice none: a plain answer, no calls
const none = await client.chat.completions.create({ model, tools, tool_choice: 'none', max_tokens: 4,
  messages: [{ role: 'user', content: 'Hi' }] });
assert.equal(none.choices[0].message.tool_calls ?? undefined, undefined);

// bad tools: a 400 naming the field
await assert.rejects(
  client.chat.completions.create({ model, max_tokens: 4, messages: [{ role: 'user', content: 'x' }],
    tools: [{ type: 'function', function: { name: 'bad name' } }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].function.name');
await assert.rejects(
  client.chat.completions.create({ model, max_tokens: 4, messages: [{ role: 'user', content: 'x' }], tools,
    tool_choice: { type: 'function', function: { name: 'nope' } } }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice');

console.log('openai node client tools: ' + out.join(' | '));
