// Writes reference ids (Hugging Face's Rust tokenizers) and chat renderings
// (@huggingface/jinja) for a model whose files cannot be committed, such as
// Llama 3's, for the strings and conversations of reference.json; compare
// with `go run ./scripts/tokref/check`. See README.md.
// usage: node gen_local.mjs <dir with tokenizer.json> <reference.json> <out.json>
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
const require = createRequire(path.join(process.cwd(), "package.json"));
const { Tokenizer } = require("tokenizers");
const { Template } = require("@huggingface/jinja");

const [dir, refFile, outFile] = process.argv.slice(2);
if (!outFile) throw new Error("usage: node gen_local.mjs <dir> <reference.json> <out.json>");
const ref = JSON.parse(fs.readFileSync(refFile, "utf8"));
const t = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
const cfgFile = path.join(dir, "tokenizer_config.json");
const cfg = fs.existsSync(cfgFile) ? JSON.parse(fs.readFileSync(cfgFile, "utf8")) : {};
const tokStr = (v) => (v == null ? undefined : typeof v === "string" ? v : v.content);
const ids = async (text, addSpecialTokens = false) =>
  Array.from((await t.encode(text, null, { addSpecialTokens })).getIds());

const out = { tokenizers: require("tokenizers/package.json").version, cases: [], chats: [] };
for (const c of ref.cases) {
  out.cases.push({ text: c.text, ids: await ids(c.text), ids_special: await ids(c.text, true) });
}
if (typeof cfg.chat_template === "string") {
  const tmpl = new Template(cfg.chat_template);
  for (const c of ref.chats) {
    const rendered = tmpl.render({
      messages: c.messages, add_generation_prompt: true,
      bos_token: tokStr(cfg.bos_token), eos_token: tokStr(cfg.eos_token),
    });
    out.chats.push({ messages: c.messages, rendered, ids: await ids(rendered) });
  }
}
fs.writeFileSync(outFile, JSON.stringify(out));
console.log(`wrote ${out.cases.length} cases, ${out.chats.length} chats`);
