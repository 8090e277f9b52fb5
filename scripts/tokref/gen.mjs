// Produces internal/hftok/testdata/reference.json: the token ids Hugging
// Face's Rust tokenizers library (its Node binding, npm "tokenizers")
// computes for tricky strings, and chat templates rendered with
// @huggingface/jinja (checked against Python Jinja2 by check_jinja2.py).
// See README.md in this folder for how to run it.
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { createRequire } from "node:module";
// Packages resolve from the working directory (the scratch npm project).
const require = createRequire(path.join(process.cwd(), "package.json"));
const { Tokenizer } = require("tokenizers");
const { Template } = require("@huggingface/jinja");

const testdata = process.argv[2];
if (!testdata) throw new Error("usage: node gen.mjs <internal/hftok/testdata>");

function loadJSON(file) {
  let b = fs.readFileSync(file);
  if (file.endsWith(".gz")) b = zlib.gunzipSync(b);
  return b.toString("utf8");
}

const models = {
  gpt2: { tok: loadJSON(path.join(testdata, "gpt2/tokenizer.json.gz")) },
  qwen2_5: {
    tok: loadJSON(path.join(testdata, "qwen2_5/tokenizer.json.gz")),
    cfg: JSON.parse(loadJSON(path.join(testdata, "qwen2_5/tokenizer_config.json"))),
  },
};
// The same Qwen file with ignore_merges set, to exercise that flag.
{
  const j = JSON.parse(models.qwen2_5.tok);
  j.model.ignore_merges = true;
  models.qwen2_5_ignore_merges = { tok: JSON.stringify(j) };
}
// The same Qwen file with a TemplateProcessing post-processor (as Llama 3's
// adds <|begin_of_text|>), for add_special_tokens=True.
{
  const j = JSON.parse(models.qwen2_5.tok);
  const st = (content) => {
    const id = j.added_tokens.find((t) => t.content === content).id;
    return { id: content, ids: [id], tokens: [content] };
  };
  j.post_processor = {
    type: "Sequence",
    processors: [
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
      {
        type: "TemplateProcessing",
        single: [
          { SpecialToken: { id: "<|endoftext|>", type_id: 0 } },
          { Sequence: { id: "A", type_id: 0 } },
          { SpecialToken: { id: "<|im_end|>", type_id: 0 } },
        ],
        pair: [
          { SpecialToken: { id: "<|endoftext|>", type_id: 0 } },
          { Sequence: { id: "A", type_id: 0 } },
          { Sequence: { id: "B", type_id: 1 } },
        ],
        special_tokens: { "<|endoftext|>": st("<|endoftext|>"), "<|im_end|>": st("<|im_end|>") },
      },
    ],
  };
  models.qwen2_5_template = { tok: JSON.stringify(j) };
}

function para(i) {
  return `Section ${i}: The quick brown fox (id=${i * 7919}) jumps over the lazy dog.\n` +
    `\tdef f_${i}(x):  return x**${i % 10} + ${i * 123456789 % 1000003}  # comment\n` +
    `  Ünïcödé ${"日本語のテキスト"} 😀 ${i % 3 === 0 ? "<|im_end|>" : ""}   \n\n`;
}
let long = "";
for (let i = 0; long.length < 60000; i++) long += para(i);

const texts = [
  "",
  " ",
  "  ",
  "a",
  "Hello world",
  "Hello, world! How's it going?",
  "   leading and trailing spaces   ",
  "multiple    spaces   between\twords",
  "\n",
  "\n\n\n",
  "line one\nline two\r\nline three\r\r\n",
  " \n \n  \n\t\n",
  "\t\ttabs\t\tand  \t mixed \t\n",
  "trailing newline spaces  \n  ",
  "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
  "3.14159265358979323846 -42 +7 1e10 0x1F 1,000,000",
  "I'm you're he's we've they'll I'd don't DON'T It'S",
  "it\u2019s curly; it'ſ long s; 'll at start",
  "你好，世界！这是一个测试。",
  "日本語のテキストとカタカナ、ひらがな。",
  "한국어 텍스트 입니다",
  "مرحبا بالعالم",
  "नमस्ते दुनिया",
  "ภาษาไทย",
  "emoji 😀👍🏽👨‍👩‍👧‍👦🇺🇸 done",
  "combining e\u0301 A\u030A \u1100\u1161 n\u0303o",
  "precomposed é Å 가 ño",
  "nbsp\u00a0ideographic\u3000space line\u2028sep nel\u0085 zwsp\u200b fs\u001c vt\u000b ff\u000c",
  "func main() {\n\tfmt.Println(\"hi\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
  "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x  # neg\n",
  "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
  "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
  "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
  "text<|endoftext|>more<|endoftext|>",
  "<|im_start|><|im_end|><|im_start|>",
  "partial <|im_start and <|im_end| and <| |>",
  " <|im_end|> spaced <|im_end|>  ",
  "<|fim_prefix|>def<|fim_suffix|>pass<|fim_middle|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
  "!!!??? ... --- ___ *** ### @@@ $$$ %%% ^^^",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
  "MiXeD CaSe WORDS and snake_case and camelCaseWords and kebab-case",
  "\u00ff\u00fe\u0100 byte-level edge chars Ġ Ċ ĉ",
  "\ud83d\ude00".repeat(3) + "\u{10FFFF}\u{E000}",
  "  \n\n  x  \n\n  ",
  // Words Llama 3's vocabulary holds whole but its merges would split
  // (ignore_merges keeps them whole).
  "Cumhuriyet Merkezi görüntü yapıldı; diễn ーション přítom",
  long,
];

function chatRender(tmpl, messages, cfg) {
  const t = new Template(tmpl);
  const tokStr = (v) => (v == null ? "" : typeof v === "string" ? v : v.content);
  return t.render({
    messages,
    add_generation_prompt: true,
    bos_token: tokStr(cfg.bos_token),
    eos_token: tokStr(cfg.eos_token),
  });
}

const chats = [
  [{ role: "user", content: "Hello!" }],
  [
    { role: "system", content: "You are a terse assistant." },
    { role: "user", content: "What is 2+2?" },
    { role: "assistant", content: "4." },
    { role: "user", content: "And   times 3?\n\nExplain." },
  ],
  [
    { role: "user", content: "Translate: 你好，世界 😀" },
    { role: "assistant", content: "Hello, world 😀" },
    { role: "user", content: "Now with <|im_end|> inside and\ttabs  \n" },
  ],
  [
    { role: "system", content: "" },
    { role: "user", content: "" },
  ],
  [
    { role: "user", content: "Code:\n```go\nfunc f() {\n\treturn\n}\n```" },
  ],
];

const encoded = {};
for (const [name, m] of Object.entries(models)) {
  m.t = Tokenizer.fromString(m.tok);
}
async function ids(m, text, addSpecialTokens = false) {
  const e = await m.t.encode(text, null, { addSpecialTokens });
  return Array.from(e.getIds());
}

const out = { generator: "scripts/tokref/gen.mjs", tokenizers: require("tokenizers/package.json").version, cases: [], chats: [] };
for (const text of texts) {
  const c = { text, ids: {}, ids_special: {} };
  for (const [name, m] of Object.entries(models)) {
    c.ids[name] = await ids(m, text);
    // add_special_tokens=True, on the shorter strings only (size).
    if (text.length < 1000) c.ids_special[name] = await ids(m, text, true);
  }
  out.cases.push(c);
}
const tmpl = models.qwen2_5.cfg.chat_template;
for (const messages of chats) {
  const rendered = chatRender(tmpl, messages, models.qwen2_5.cfg);
  out.chats.push({ model: "qwen2_5", messages, rendered, ids: await ids(models.qwen2_5, rendered) });
}
// One case per line keeps diffs readable.
const lines = [
  "{",
  `"generator": ${JSON.stringify(out.generator)},`,
  `"tokenizers": ${JSON.stringify(out.tokenizers)},`,
  `"cases": [`,
  out.cases.map((c) => JSON.stringify(c)).join(",\n"),
  `],`,
  `"chats": [`,
  out.chats.map((c) => JSON.stringify(c)).join(",\n"),
  `]`,
  "}",
];
fs.writeFileSync(path.join(testdata, "reference.json"), lines.join("\n") + "\n");
console.log(`wrote ${out.cases.length} cases, ${out.chats.length} chats`);
