// The Node SDK matrix: the official `openai` and `@anthropic-ai/sdk` clients and Vercel's `ai`
// with `@ai-sdk/openai` (chat and Responses providers) against a gateway.
// Usage: node node_matrix.mjs <gateway base URL> <model>; prints one JSON object
// {sdk: {case: "pass" | "FAIL: <message>"}} on stdout. Run by tests/clients/test_node_sdks.py
// with NODE_PATH set to the cached node_modules (tests/agents/install.py).
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH, "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const AnthropicMod = require("@anthropic-ai/sdk");
const Anthropic = AnthropicMod.default ?? AnthropicMod;
const ai = require("ai");
const { createOpenAI } = require("@ai-sdk/openai");

const [base, model] = process.argv.slice(2);
const fast = `${model}-fast`;
const USER = [{ role: "user", content: "Weather in Paris?" }];
const WEATHER = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
const results = {};

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

async function cell(sdk, name, fn) {
  results[sdk] ??= {};
  try {
    await fn();
    results[sdk][name] = "pass";
  } catch (e) {
    results[sdk][name] = `FAIL: ${String(e?.message ?? e).slice(0, 300)}`;
  }
}

async function rejects(fn, cls) {
  try {
    await fn();
  } catch (e) {
    check(e instanceof cls, `expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
    return;
  }
  throw new Error(`expected ${cls.name}, nothing raised`);
}

const oai = new OpenAI({ baseURL: `${base}/v1`, apiKey: "x", maxRetries: 0 });
const chatTools = [{ type: "function", function: { name: "weather", parameters: WEATHER } }];
await cell("node_openai", "plain", async () => {
  const r = await oai.chat.completions.create({ model, messages: USER, max_tokens: 8 });
  check(r.choices[0].message.content, "no content");
});
await cell("node_openai", "stream", async () => {
  const s = await oai.chat.completions.create({
    model, messages: USER, max_tokens: 8, stream: true, stream_options: { include_usage: true },
  });
  let text = "", usage = null;
  for await (const c of s) {
    if (c.choices.length) text += c.choices[0].delta.content ?? "";
    if (c.usage) usage = c.usage;
  }
  check(text && usage?.completion_tokens === 8, `text ${text} usage ${JSON.stringify(usage)}`);
});
await cell("node_openai", "fast_tier", async () => {
  const { response } = await oai.chat.completions
    .create({ model: fast, messages: USER, max_tokens: 4 }).withResponse();
  check(response.headers.get("x-speedgate-tier") === "fast", "not the fast tier");
});
await cell("node_openai", "usage", async () => {
  const u = (await oai.chat.completions.create({ model, messages: USER, max_tokens: 5 })).usage;
  check(u.completion_tokens === 5 && u.total_tokens === u.prompt_tokens + 5, JSON.stringify(u));
});
await cell("node_openai", "tool_round_trip", async () => {
  const r = await oai.chat.completions.create({ model, messages: USER, tools: chatTools });
  const call = r.choices[0].message.tool_calls[0];
  const msgs = [...USER, r.choices[0].message,
    { role: "tool", tool_call_id: call.id, content: "sunny" }];
  const f = await oai.chat.completions.create({ model, messages: msgs, tools: chatTools });
  check(f.choices[0].finish_reason === "stop" && f.choices[0].message.content, "no final text");
});
await cell("node_openai", "typed_error", async () => {
  await rejects(() => oai.chat.completions.create({ model: "no-such", messages: USER }),
    OpenAI.NotFoundError);
  await rejects(() => oai.chat.completions.create({ model, messages: USER, max_tokens: 0 }),
    OpenAI.BadRequestError);
});

const ant = new Anthropic({ baseURL: base, apiKey: "x", maxRetries: 0 });
const antTools = [{ name: "weather", input_schema: WEATHER }];
await cell("node_anthropic", "plain", async () => {
  const m = await ant.messages.create({ model, max_tokens: 8, messages: USER });
  check(m.content[0].text && m.stop_reason === "max_tokens", JSON.stringify(m));
});
await cell("node_anthropic", "stream", async () => {
  const s = ant.messages.stream({ model, max_tokens: 8, messages: USER });
  let text = "";
  s.on("text", (t) => { text += t; });
  const final = await s.finalMessage();
  check(text && text === final.content[0].text, "streamed text differs");
});
await cell("node_anthropic", "fast_tier", async () => {
  const { response } = await ant.messages
    .create({ model: fast, max_tokens: 4, messages: USER }).withResponse();
  check(response.headers.get("x-speedgate-tier") === "fast", "not the fast tier");
});
await cell("node_anthropic", "usage", async () => {
  const u = (await ant.messages.create({ model, max_tokens: 5, messages: USER })).usage;
  check(u.output_tokens === 5 && u.input_tokens + (u.cache_read_input_tokens ?? 0) > 0,
    JSON.stringify(u));
});
await cell("node_anthropic", "tool_round_trip", async () => {
  const m = await ant.messages.create({ model, max_tokens: 64, messages: USER, tools: antTools });
  const use = m.content.find((b) => b.type === "tool_use");
  const msgs = [...USER, { role: "assistant", content: m.content },
    { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny" }] }];
  const f = await ant.messages.create({ model, max_tokens: 64, messages: msgs, tools: antTools });
  check(f.stop_reason === "end_turn", f.stop_reason);
});
await cell("node_anthropic", "typed_error", async () => {
  await rejects(() => ant.messages.create({ model: "no-such", max_tokens: 4, messages: USER }),
    Anthropic.NotFoundError);
  await rejects(() => ant.messages.create({ model, max_tokens: 0, messages: USER }),
    Anthropic.BadRequestError);
});

const provider = createOpenAI({ baseURL: `${base}/v1`, apiKey: "x" });
for (const [sdk, make] of [["vercel_ai_chat", (m) => provider.chat(m)],
  ["vercel_ai_responses", (m) => provider.responses(m)]]) {
  const prompt = "Weather in Paris?";
  await cell(sdk, "plain", async () => {
    const r = await ai.generateText({ model: make(model), prompt, maxOutputTokens: 8,
      maxRetries: 0 });
    check(r.text, "no text");
  });
  await cell(sdk, "stream", async () => {
    const r = ai.streamText({ model: make(model), prompt, maxOutputTokens: 8, maxRetries: 0 });
    let text = "";
    for await (const t of r.textStream) text += t;
    check(text && text === (await r.text), "streamed text differs");
  });
  await cell(sdk, "fast_tier", async () => {
    const r = await ai.generateText({ model: make(fast), prompt, maxOutputTokens: 4,
      maxRetries: 0 });
    check(r.response.headers["x-speedgate-tier"] === "fast", JSON.stringify(r.response.headers));
  });
  await cell(sdk, "usage", async () => {
    const r = await ai.generateText({ model: make(model), prompt, maxOutputTokens: 5,
      maxRetries: 0 });
    check(r.usage.outputTokens === 5 && r.usage.inputTokens > 0, JSON.stringify(r.usage));
  });
  await cell(sdk, "tool_round_trip", async () => {
    let called = 0;
    const weather = ai.tool({ description: "Weather of a city", inputSchema: ai.jsonSchema(WEATHER),
      execute: async () => { called += 1; return "sunny"; } });
    const r = await ai.generateText({ model: make(model), prompt, tools: { weather },
      stopWhen: ai.stepCountIs(5), maxRetries: 0 });
    check(called === 1 && r.steps.length === 2 && r.text, `called ${called} steps ${r.steps.length}`);
  });
  await cell(sdk, "typed_error", async () => {
    await rejects(() => ai.generateText({ model: make("no-such"), prompt, maxRetries: 0 }),
      ai.APICallError);
  });
}

process.stdout.write(JSON.stringify(results));
