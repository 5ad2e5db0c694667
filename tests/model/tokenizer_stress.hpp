#pragma once
// Texts that stress a tokenizer's pipeline, shared by the tokenizer.json and tiktoken truth tests.
#include <string>
#include <vector>

namespace kvq {
namespace {

// Written for this test: each line stresses one part of the pipeline.
inline std::vector<std::string> stress_texts() {
  std::vector<std::string> t = {
      "",
      "Hello, world! How's it going?",
      // contractions in every case, and the long s, which case-folds to s under (?i)
      "'s 'S 't 'T 're 'Re 'rE 'RE 've 'Ve 'VE 'm 'M 'll 'Ll 'lL 'LL 'd 'D",
      "I'M YOU'RE THEY'LL WE'VE HE'D IT'S DON'T can't Won'T it\u2019s 'ſ 'ſt x'S",
      "don't'll've'd 's's''s '' ' 's",
      // CJK, kana, hangul
      "我爱北京天安门。今天天气很好！人工智能",
      "こんにちは、世界。カタカナとひらがな",
      "안녕하세요 세계, 한국어 텍스트",
      // emoji with ZWJ sequences, skin tones, flags, variation selectors
      "👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽 tone 🧑🏿‍🚀 astronaut ❤️ 🇩🇪🇯🇵 ☺︎",
      // combining marks (decomposed vs precomposed; NFC changes them for Qwen), zalgo, jamo
      "e\u0301 a\u0308 n\u0303 o\u0302 vs é ä ñ ô; Å vs A\u030a; \u212b angstrom",
      "Z\u0334\u0321\u0322\u031b\u0356\u034ea\u0338l\u0337g\u0336o\u0335 text",
      "\u1100\u1161\u11a8 \u1112\u1161\u11ab decomposed hangul",
      // fullwidth and ideographic space
      "ＡＢＣ　１２３！？ｆｕｌｌｗｉｄｔｈ",
      // digit runs in several scripts
      "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 0x7fff 2024-01-01",
      "١٢٣٤٥ ०१२३४ ໑໒໓ 二十三 ⅫⅣ ①②③ ²³",
      // \r\n and whitespace runs
      "a\r\nb\r\n\r\nc\n\n\nd\r\re\n \n \n",
      "  \t\t  spaces   and\ttabs\t\t\n   indented\n        deep",
      "trailing     ",
      "     leading",
      "\u00a0nbsp\u2003em\u2009thin\u3000ideo\u202fnarrow \u180e mongolian \u200b zwsp",
      "line\u2028sep\u2029para\u0085nel\x0bvt\x0c" "ff",
      // control characters
      std::string("nul\0byte", 8),
      "\x01\x02\x07\x08\x1b[31mred\x1b[0m\x7f del",
      // literal special-token strings (Llama-3 and Qwen), partial and adjacent ones
      "<|begin_of_text|>Hello<|end_of_text|>",
      "<|begin_of_text|><|begin_of_text|> double",
      "text<|eot_id|>more<|start_header_id|>user<|end_header_id|>\n\nhi",
      "<|reserved_special_token_5|> and <|reserved_special_token_250|>",
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
      "<think>\nreasoning\n</think>\n\nanswer <tool_call>{}</tool_call>",
      "<|im_start <|im_start|>|> <|<|im_end|> <|endoftext|><|endoftext|>",
      "<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>",
      "<\uff5cbegin\u2581of\u2581sentence\uff5c>Hi<\uff5cend\u2581of\u2581sentence\uff5c> <|endofprompt|>",
      // other scripts
      "Привет мир! Ёлка. ΑΒΓ αβγ άέή",
      "مرحبا بالعالم שלום עולם नमस्ते दुनिया สวัสดีชาวโลก",
      // code, URLs, symbols, punctuation runs
      "def f(x):\n    return x**2  # comment\n\tif (a&&b) { c++; } // end\n",
      "https://example.com/a?b=c&d=e#f user@mail.org C:\\path\\to\\file.txt",
      "$100.00 €50 £30 ¥1000 — – … “quoted” ‘single’ «guillemets» ©®™°±×÷",
      "!!!??? ... --- *** ### @@@ ((())) [[[]]] {{{}}} ''' \"\"\"",
      "ǅungla ǈ ǋ Ǳ ß ẞ ﬁ ﬀ İstanbul ı Straße KELVIN\u212a",
  };
  t.push_back(std::string(1000, 'a'));
  t.push_back(std::string(500, ' ') + "x" + std::string(300, ' '));
  t.push_back(std::string(100, '\n') + "x" + std::string(50, '\r') + std::string(50, '\n'));
  t.push_back(std::string(300, '!'));
  std::string digits;
  for (int i = 1; i <= 300; ++i) digits += std::to_string(i);
  t.push_back(digits);
  std::string words;
  for (int i = 0; i < 200; ++i) words += "antidisestablishmentarianism";
  t.push_back(words);
  return t;
}

// Bytes that are not valid UTF-8: both sides must replace the same maximal subparts with U+FFFD.
const std::string kInvalidUtf8 = "ok \xff\xfe abc \xc3\x28 d \xe2\x82 e \xf0\x9f\x98 f \xed\xa0\x80 g \xc0\xaf h\xf4\x90\x80\x80 end";

}  // namespace
}  // namespace kvq
