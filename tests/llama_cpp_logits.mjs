// Run a GGUF model in llama.cpp on the CPU, through node-llama-cpp's prebuilt llama.cpp binaries.
//
//     node llama_cpp_logits.mjs PREFIX MODEL.gguf IDS.json NEW
//
// PREFIX holds node_modules/node-llama-cpp (an npm install, tests/test_llama_cpp.py). IDS.json is a
// list of token ids. Prints one JSON object: `greedy`, the NEW tokens llama.cpp's greedy sampler
// (temperature 0) generates after the ids, and `logits`, llama.cpp's next-token logits at every
// position of the ids followed by those tokens (one decode with logits for every position).
import {readFileSync} from "node:fs";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

const [prefix, modelPath, idsPath, newTokens] = process.argv.slice(2);
const {getLlama} = await import(pathToFileURL(join(prefix, "node_modules", "node-llama-cpp", "dist", "index.js")));
const ids = JSON.parse(readFileSync(idsPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({  // the key/value cache in f32, as the model computes it (default: f16)
    contextSize: 64, batchSize: 64, sequences: 1, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const sequence = context.getSequence();

const greedy = [];
for await (const token of sequence.evaluate(ids, {temperature: 0})) {
    greedy.push(token);
    if (greedy.length >= Number(newTokens)) break;
}
await sequence.clearHistory();
const scored = await sequence.controlledEvaluate([...ids, ...greedy].map(id => [id, {generateNext: {logits: true}}]));
const logits = scored.map(item => {
    const row = [];
    for (const [token, logit] of item.next.logits) row[token] = logit;
    return row;
});
console.log(JSON.stringify({greedy, logits}));
await context.dispose();
await model.dispose();
await llama.dispose();
