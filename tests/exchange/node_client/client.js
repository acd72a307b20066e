// A foreign client of the exchange: node client.js TARGET RUN_ID
//
// Its stubs come from proto/mrl/v1/*.proto at run time (@grpc/proto-loader), nothing from the SDK,
// and its channel has grpc-js's default options (at most 4 MiB received per message). It publishes
// 64 rollouts of 100 KB, subscribes (server-default credit and response size), acks every delivery
// without a subscription_id, and prints one JSON line: {"published", "delivered", "acked"}. Any error,
// or not all acked within 60 s, exits 1.
'use strict';
const crypto = require('crypto');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const N = 64;
const TEXT_BYTES = 100 * 1000;
const BATCH = 16;
const PROTO_ROOT = path.resolve(__dirname, '..', '..', '..', 'proto');

const [target, runId] = process.argv.slice(2);
if (!target || !runId) {
  console.error('usage: node client.js TARGET RUN_ID');
  process.exit(2);
}

function fail(message) {
  console.error(`node client: ${message}`);
  process.exit(1);
}

const definition = protoLoader.loadSync('mrl/v1/exchange.proto', {includeDirs: [PROTO_ROOT], keepCase: true,
  longs: String, enums: String, defaults: true});
const mrl = grpc.loadPackageDefinition(definition).mrl.v1;
const exchange = new mrl.ExperienceExchange(target, grpc.credentials.createInsecure());

function rollout(i) {
  const now = Date.now();
  return {
    experience_id: crypto.randomUUID().replace(/-/g, ''), run_id: runId, producer: 'node-a', policy_version: 1,
    created_at: {seconds: String(Math.floor(now / 1000)), nanos: (now % 1000) * 1e6}, schema_version: 1,
    rollout: {prompt_id: `node/0/${i}`, prompt_text: 'x'.repeat(TEXT_BYTES), response_text: '42',
      token_ids: [1, 2, 3, 4], logprobs: [-0.5, -0.5, -0.5, -0.5], reward: 1, verdict: 'VERDICT_CORRECT',
      group_id: 'g0', tokenizer_id: 'gpt2', sample_index: i},
  };
}

const unary = (method, request) => new Promise((resolve, reject) =>
  exchange[method](request, (err, reply) => (err ? reject(err) : resolve(reply))));

async function main() {
  const sent = Array.from({length: N}, (_, i) => rollout(i));
  let published = 0;
  for (let i = 0; i < N; i += BATCH) {
    published += (await unary('Publish', {experiences: sent.slice(i, i + BATCH)})).accepted;
  }
  const wanted = new Set(sent.map((e) => e.experience_id));
  const delivered = new Set();
  let acked = 0;
  const timer = setTimeout(() => fail(`timed out: ${delivered.size} delivered, ${acked} acked of ${N}`), 60000);
  const stream = exchange.Subscribe({run_id: runId, subscriber: 'node-b', start: 'START_POSITION_EARLIEST'});
  stream.on('data', (response) => {
    const ids = response.deliveries.map((d) => d.delivery_id);
    for (const d of response.deliveries) {
      if (!wanted.has(d.experience.experience_id)) fail(`delivered an unknown experience ${d.experience.experience_id}`);
      if (d.experience.rollout.prompt_text.length !== TEXT_BYTES) fail('a rollout arrived altered');
      delivered.add(d.experience.experience_id);
    }
    if (!ids.length) return;
    unary('Ack', {run_id: runId, subscriber: 'node-b', delivery_ids: ids}).then((reply) => {
      acked += reply.acked;
      if (acked === N) {
        clearTimeout(timer);
        stream.cancel();
        console.log(JSON.stringify({published, delivered: delivered.size, acked}));
        exchange.close();
      }
    }, (err) => fail(`Ack failed: ${err.message}`));
  });
  stream.on('error', (err) => {
    if (err.code !== grpc.status.CANCELLED) fail(`Subscribe failed: ${err.message}`);
  });
}

main().catch((err) => fail(err.message));
