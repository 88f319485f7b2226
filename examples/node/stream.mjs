// The Node openai SDK streaming a chat completion from surge.
//
//   cd examples/node && npm install && SURGE_BASE_URL=http://127.0.0.1:8000/v1 node stream.mjs
//
// Environment: SURGE_BASE_URL (default http://127.0.0.1:8000/v1), SURGE_API_KEY (any value when
// the server has no keys), SURGE_MODEL_NAME (default: the first model /v1/models lists).
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.SURGE_BASE_URL ?? "http://127.0.0.1:8000/v1",
  apiKey: process.env.SURGE_API_KEY ?? "unused",
});

let model = process.env.SURGE_MODEL_NAME;
if (!model) {
  const models = await client.models.list();
  model = models.data[0].id;
}

const stream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Tell me a very short story." }],
  max_tokens: 32,
  stream: true,
  stream_options: { include_usage: true },
});

let numChunks = 0;
for await (const chunk of stream) {
  const delta = chunk.choices[0]?.delta?.content;
  if (delta) {
    numChunks += 1;
    process.stdout.write(delta);
  }
  if (chunk.choices[0]?.finish_reason) {
    process.stdout.write(`\nfinish_reason: ${chunk.choices[0].finish_reason}\n`);
  }
  if (chunk.usage) {
    console.log(`usage: ${chunk.usage.prompt_tokens} prompt + ${chunk.usage.completion_tokens} completion tokens`);
  }
}
console.log(`streamed ${numChunks} chunks`);
