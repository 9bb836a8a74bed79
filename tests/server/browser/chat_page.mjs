// chat_page.mjs — drives the chat page of `kvsieve serve` (GET /) in a real
// browser: Debian's chromium, headless, through puppeteer-core (which
// downloads no browser of its own).  Run by tests/server/chat_page.sh.
//
// Usage: node chat_page.mjs BASE_URL API_KEY SCREENSHOT.png DOC.txt
// Checks, in order: the page loads from the binary and asks for the key;
// the key typed in the sidebar reaches the API; a pasted document and a
// question give an answer that arrives in several pieces (streaming), with
// TTFT, tokens and the conversation's policy and budget; a follow-up
// reports cached tokens > 0 (the document came from the prefix cache);
// with "Token probabilities" on, an answer is drawn token by token with each
// token's probability and alternatives (on hover and in a table) that add
// up to the answer's text;
// the stop button ends a long answer and the server cancels it; the
// conversations survive a reload; an uploaded file becomes the document;
// conversations can be created, switched and deleted.
import puppeteer from "puppeteer-core";

const [base, key, shot, docPath] = process.argv.slice(2);
const browserPath = process.env.CHROMIUM || "/usr/bin/chromium";
let failures = 0;
const fail = (msg) => { console.log("FAIL: " + msg); failures++; };
const ok = (cond, msg) => { if (!cond) fail(msg); else console.log("ok: " + msg); };

const DOC = [
  "The Lighthouse Keeper's Log.",
  "The lighthouse on Gull Rock was built in 1871 by the harbour board of Port Ellery.",
  "Its first keeper was Martha Quill, who kept the lamp burning for thirty-one years.",
  "The lamp burned colza oil until 1903, then paraffin, and it was electrified in 1956.",
  "Every night Martha wrote the weather, the ships she saw and the state of the lamp in her log.",
  "In the great storm of 1889 she rowed out twice to the schooner Alder and saved its crew of six.",
  "The harbour board gave her a silver watch, which is now kept in the town museum.",
  "The pass code of the museum's archive room is 4417, written on the first page of the log.",
].join(" ");

async function lastStats(page) {
  return page.$$eval(".msg.assistant .stats", (els) => {
    const e = els[els.length - 1];
    return e ? { cached: e.dataset.cached, ttft: e.dataset.ttft, text: e.textContent } : null;
  });
}

async function ask(page, question) {
  const before = await page.$$eval(".msg.assistant .stats", (els) => els.length);
  await page.evaluate(() => { window.__updates = 0; });
  await page.type("#prompt", question);
  await page.keyboard.press("Enter");
  await page.waitForFunction((n) => document.querySelectorAll(".msg.assistant .stats").length > n,
                             { timeout: 60000 }, before);
  const text = await page.$$eval(".msg.assistant .text", (els) => els[els.length - 1].textContent);
  return { text, stats: await lastStats(page), updates: await page.evaluate(() => window.__updates) };
}

const browser = await puppeteer.launch({
  executablePath: browserPath,
  headless: true,
  // root in a container: no user namespaces for the sandbox; no GPU here
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 860 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  // (the browser logs every non-2xx fetch, such as the expected 401, as "Failed to load resource")
  page.on("console", (m) => { if (m.type() === "error" && !/Failed to load resource/.test(m.text())) errors.push(m.text()); });
  // Count text updates of answers, to see that an answer streams in pieces.
  await page.evaluateOnNewDocument(() => {
    window.__updates = 0;
    new MutationObserver((ms) => {
      for (const m of ms) {
        const el = m.target.nodeType === 1 ? m.target : m.target.parentElement;
        if (el && el.closest && el.closest(".msg.assistant.streaming")) window.__updates++;
      }
    }).observe(document, { subtree: true, childList: true, characterData: true });
  });

  const resp = await page.goto(base + "/", { waitUntil: "load" });
  ok(resp.status() === 200, "GET / is 200 without the key");
  await page.waitForFunction(() => document.getElementById("status").textContent.includes("API key"), { timeout: 10000 })
    .then(() => console.log("ok: the page asks for the API key"), () => fail("no API-key prompt on a 401"));

  // The key, typed into the sidebar, is kept and sent.
  await page.click("#server-settings summary");
  await page.type("#api-key", key);
  await page.$eval("#api-key", (el) => el.dispatchEvent(new Event("change")));
  await page.waitForFunction(() => document.getElementById("model-name").textContent.length > 0, { timeout: 10000 })
    .then(() => console.log("ok: /v1/models answered with the key"), () => fail("the model name never showed"));

  // Paste the document (what a paste does: the value changes, an input event fires).
  await page.$eval("#doc-text", (el, doc) => {
    el.focus();
    el.value = doc;
    el.dispatchEvent(new InputEvent("input", { inputType: "insertFromPaste", bubbles: true }));
  }, DOC);
  ok((await page.$eval("#doc-info", (e) => e.textContent)).includes("characters"), "the document is counted");
  // Per-conversation settings: the policy and budget go in the kvsieve object.
  for (const [sel, v] of [["#policy", "quest"], ["#budget", "256"], ["#max-tokens", "24"], ["#temperature", "0"]]) {
    await page.$eval(sel, (el) => { el.value = ""; });
    await page.type(sel, v);
  }

  const a1 = await ask(page, "Who was the first keeper of the lighthouse?");
  console.log("answer 1:", JSON.stringify(a1.text), "|", a1.stats && a1.stats.text);
  ok(a1.text.length > 0, "the first answer has text");
  ok(a1.updates >= 2, `the first answer streamed (${a1.updates} updates)`);
  ok(a1.stats && a1.stats.ttft !== "", "the first answer shows its TTFT");
  ok(a1.stats && /policy quest/.test(a1.stats.text) && /budget 256/.test(a1.stats.text), "the stats name the policy and budget");
  ok(a1.stats && /speed [0-9.]+ tok\/s/.test(a1.stats.text), "the stats show tok/s");

  const a2 = await ask(page, "What is the pass code of the archive room?");
  console.log("answer 2:", JSON.stringify(a2.text), "|", a2.stats && a2.stats.text);
  ok(a2.text.length > 0, "the follow-up has text");
  ok(a2.stats && Number(a2.stats.cached) > 0, `the follow-up reports cached tokens (${a2.stats && a2.stats.cached})`);
  // Token probabilities, on demand: the toggle adds logprobs to the request.
  ok((await page.$$eval(".msg.assistant .tok", (els) => els.length)) === 0, "no token view without the toggle");
  await page.click("#logprobs");
  const a3 = await ask(page, "When was the lamp electrified?");
  const view = await page.$$eval(".msg.assistant", (els) => {
    const m = els[els.length - 1];
    const toks = [...m.querySelectorAll(".text .tok")];
    return { n: toks.length, joined: toks.map((t) => t.textContent).join(""), text: m.querySelector(".text").textContent,
             alts: toks.filter((t) => /%/.test(t.dataset.alts || "")).length,
             p: toks.every((t) => /^[0-9.]+%$/.test(t.dataset.p)),
             rows: m.querySelectorAll(".lp tr").length, summary: (m.querySelector(".lp summary") || {}).textContent };
  });
  console.log("answer 3:", JSON.stringify(a3.text), "|", view.summary);
  ok(view.n > 0 && view.joined === view.text, `the answer is drawn as ${view.n} tokens that make up its text`);
  ok(view.p && view.alts === view.n, "every token has its probability and alternatives");
  ok(view.rows >= view.n + 1, `the table lists every token (${view.rows - 1} rows)`);
  await page.click(".msg.assistant:last-of-type .lp summary");
  ok(await page.$eval(".msg.assistant:last-of-type .lp", (d) => d.open), "the table opens");
  await page.$eval("#messages", (b) => { b.scrollTop = b.scrollHeight; });
  await page.hover(".msg.assistant:last-of-type .text .tok:nth-child(2)");
  await page.screenshot({ path: shot });
  console.log("screenshot:", shot);

  // Stop: a long answer, stopped after its first token; the server cancels it.
  await page.$eval("#max-tokens", (el) => { el.value = ""; });
  await page.type("#max-tokens", "3500");   // prompt + max_tokens within -c 4096
  // This small model may end any answer early; the test (not the page) asks
  // the server to ignore end-of-generation so that there is something to stop.
  await page.setRequestInterception(true);
  const addIgnoreEos = (rq) => {
    if (rq.isInterceptResolutionHandled()) return;
    if (rq.method() === "POST" && rq.url().endsWith("/v1/chat/completions")) {
      const body = JSON.parse(rq.postData());
      body.kvsieve = Object.assign(body.kvsieve || {}, { ignore_eos: true });
      rq.continue({ postData: JSON.stringify(body) });
    } else rq.continue();
  };
  page.on("request", addIgnoreEos);
  // The page clicks stop itself on the answer's first text: a round trip
  // from the driver to the browser under load could outlast the answer.
  await page.evaluate(() => {
    window.__stopEnabled = null;
    const obs = new MutationObserver(() => {
      const s = document.querySelector(".msg.assistant.streaming .text");
      if (!s || !s.textContent.length) return;
      obs.disconnect();
      const stop = document.getElementById("stop");
      window.__stopEnabled = !stop.disabled;
      stop.click();
    });
    obs.observe(document.getElementById("messages"), { subtree: true, childList: true, characterData: true });
  });
  await page.type("#prompt", "Tell the whole story of the storm in detail.");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => window.__stopEnabled !== null, { timeout: 60000 });
  ok(await page.evaluate(() => window.__stopEnabled), "stop is enabled while an answer streams");
  await page.waitForFunction(() => !document.querySelector(".msg.assistant.streaming"), { timeout: 10000 });
  const st = await lastStats(page);
  ok(/finish stopped/.test(st.text), "the stopped answer says so: " + st.text);
  page.off("request", addIgnoreEos);
  await page.setRequestInterception(false);
  ok(!(await page.$eval("#send", (b) => b.disabled)), "send is enabled again after stop");
  let cancelled = 0;
  for (let i = 0; i < 50 && !cancelled; i++) {
    const m = await (await fetch(base + "/metrics", { headers: { Authorization: "Bearer " + key } })).text();
    cancelled = Number((m.match(/kvsieve_requests_total\{outcome="cancelled"\} (\d+)/) || [])[1] || 0);
    if (!cancelled) await new Promise((r) => setTimeout(r, 200));
  }
  ok(cancelled >= 1, "the server cancelled the stopped request");

  // The conversation survives a reload (localStorage), settings included.
  await page.reload({ waitUntil: "load" });
  await page.waitForSelector(".msg.assistant .stats");
  const n = await page.$$eval(".msg", (els) => els.length);
  ok(n === 8, `the reloaded page shows the 8 messages (${n})`);
  ok((await page.$$eval(".msg.assistant .tok", (els) => els.length)) > 0, "the token view survives the reload");
  ok((await page.$eval("#policy", (e) => e.value)) === "quest", "the policy is kept per conversation");

  // A second conversation, its document uploaded; switch and delete.
  await page.click("#new-conv");
  ok((await page.$$eval("#conv-list li", (l) => l.length)) === 2, "a new conversation is listed");
  const input = await page.$("#doc-file");
  await input.uploadFile(docPath);
  await page.waitForFunction(() => document.getElementById("doc-text").value.length > 0, { timeout: 10000 });
  ok((await page.$eval("#doc-info", (e) => e.textContent)).includes("doc.txt"), "an uploaded file becomes the document");
  ok((await page.$$eval(".msg", (els) => els.length)) === 0, "the new conversation is empty");
  await page.click("#conv-list li:nth-child(2) .title");
  ok((await page.$$eval(".msg", (els) => els.length)) === 8, "switching back shows the first conversation");
  await page.click("#conv-list li:nth-child(1) .delete");
  ok((await page.$$eval("#conv-list li", (l) => l.length)) === 1, "a deleted conversation leaves the list");
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem("kvsieve.chat.v1")).length);
  ok(stored === 1, "and leaves localStorage");

  ok(errors.length === 0, "no script errors" + (errors.length ? ": " + errors.join("; ") : ""));
} catch (e) {
  fail("exception: " + (e && e.stack || e));
} finally {
  await browser.close();
}
console.log(failures ? `${failures} check(s) failed` : "all chat page checks passed");
process.exit(failures ? 1 : 0);
