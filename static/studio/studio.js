/* Studio's small amount of glue around htmx and its WebSocket extension. */
(function () {
  "use strict";

  // Swap 409 responses too: the decision view answers "already decided" with
  // the current card, which must replace the stale one.
  htmx.config.responseHandling = [
    { code: "204", swap: false },
    { code: "[23]..", swap: true },
    { code: "409", swap: true, error: false },
    { code: "[45]..", swap: false, error: true },
    { code: "...", swap: false },
  ];

  function $(id) { return document.getElementById(id); }

  function setConnection(state, label) {
    var el = $("conn-state");
    if (!el) return;
    el.dataset.state = state;
    el.className = "conn conn-" + state;
    el.textContent = label;
  }

  // A chat page's first socket says when the page was drawn (?since=): the
  // server then sends only what changed since. A reconnect may have missed
  // anything, so it asks for everything. (htmx's documented hook for sockets.)
  var opened = {};
  htmx.createWebSocket = function (url) {
    if (opened[url]) url = url.replace(/[?&]since=\d+/, "");
    opened[url] = true;
    var socket = new WebSocket(url, []);
    socket.binaryType = htmx.config.wsBinaryType;
    return socket;
  };

  document.addEventListener("htmx:wsConnecting", function () { setConnection("connecting", "Connecting…"); });
  document.addEventListener("htmx:wsOpen", function () { setConnection("online", "Live"); });
  document.addEventListener("htmx:wsClose", function (evt) {
    var code = evt.detail.event && evt.detail.event.code;
    // Codes the server closes with on purpose: do not reconnect, say why.
    var final = {
      4401: "Logged out — reload the page to log in again",
      4403: "Not allowed — reload the page",
      4404: "Not found — this conversation is gone",
    };
    if (final[code]) {
      setConnection("offline", final[code]);
      var wrapper = evt.detail.socketWrapper;
      if (wrapper && wrapper.close) wrapper.close();
      return;
    }
    setConnection("offline", "Offline — reconnecting…");
    // The extension retries abnormal closures itself; retry the others too
    // (a server restart closes with 1001), unless the page is going away.
    // At a random moment within 0.5 to 3 s: every tab of a restarted process
    // is closed at once, and would otherwise come back, and be caught up, at once.
    if ([1006, 1011, 1012, 1013].indexOf(code) < 0 && !window.__studioUnloading) {
      var wrapper = evt.detail.socketWrapper;
      var delay = 500 + Math.random() * 2500;
      setTimeout(function () { if (wrapper && wrapper.reconnect) wrapper.reconnect(); }, delay);
    }
  });
  window.addEventListener("beforeunload", function () { window.__studioUnloading = true; });

  // Enter sends, Shift+Enter makes a new line.
  document.addEventListener("keydown", function (evt) {
    var t = evt.target;
    if (t && t.id === "message-input" && evt.key === "Enter" && !evt.shiftKey && !evt.isComposing) {
      evt.preventDefault();
      if (t.value.trim() || attachments.length) t.form.requestSubmit();
    }
  });

  // The message's length near its limit, and never a silent cut: a message
  // over the limit is not sent, and the member is told the limit.
  function messageLength(input) {
    var max = parseInt(input.dataset.maxLength || "0", 10);
    var count = $("message-count");
    var n = input.value.length;
    if (count && max) {
      count.hidden = n < max * 0.9;
      count.classList.toggle("over", n > max);
      count.textContent = n.toLocaleString("en-US") + " / " + max.toLocaleString("en-US") +
        (n > max ? " characters: too long to send" : " characters");
    }
    return { n: n, max: max };
  }
  document.addEventListener("input", function (evt) {
    if (evt.target && evt.target.id === "message-input") messageLength(evt.target);
  });
  // Files sent with a message: the paperclip, a drop on the box or a paste
  // add them here; on send they are uploaded first (all or none), and the
  // message goes with their names, which the server checks and words.
  var attachments = [], attachedNames = null;
  function showAttachments() {
    var list = $("attachments"), input = $("message-input");
    if (!list) return;
    list.innerHTML = "";
    attachments.forEach(function (file, i) {
      var item = document.createElement("li");
      var name = document.createElement("span");
      name.textContent = file.name;
      var remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "×";
      remove.setAttribute("aria-label", "Remove " + file.name);
      remove.addEventListener("click", function () {
        attachments.splice(i, 1);
        attachedNames = null;
        showAttachments();
        if (input) input.focus();
      });
      item.appendChild(name);
      item.appendChild(remove);
      list.appendChild(item);
    });
    list.hidden = attachments.length === 0;
    // A message may be files alone.
    if (input) input.required = attachments.length === 0;
  }
  function attach(files) {
    attachedNames = null;  // the list changed: upload it again
    Array.prototype.forEach.call(files || [], function (file) {
      if (!attachments.some(function (f) { return f.name === file.name; })) attachments.push(file);
    });
    showAttachments();
  }
  document.addEventListener("change", function (evt) {
    if (evt.target && evt.target.id === "attach-input") {
      attach(evt.target.files);
      evt.target.value = "";  // the files are held here, not in the form
      var input = $("message-input");
      if (input) input.focus();
    }
  });
  document.addEventListener("paste", function (evt) {
    if (!evt.target || evt.target.id !== "message-input") return;
    var files = evt.clipboardData && evt.clipboardData.files;
    if (files && files.length) { evt.preventDefault(); attach(files); }
  });
  ["dragover", "dragleave", "drop"].forEach(function (kind) {
    document.addEventListener(kind, function (evt) {
      var composer = evt.target && evt.target.closest && evt.target.closest("#composer");
      if (!composer) return;
      var types = evt.dataTransfer && evt.dataTransfer.types;
      if (!types || Array.prototype.indexOf.call(types, "Files") < 0) return;
      evt.preventDefault();
      composer.classList.toggle("dropping", kind === "dragover");
      if (kind === "drop") attach(evt.dataTransfer.files);
    });
  });
  function uploadThenSend(form) {
    var body = new FormData();
    attachments.forEach(function (file) { body.append("files", file, file.name); });
    var token = form.querySelector("input[name=csrfmiddlewaretoken]");
    var notice = $("notice");
    fetch(form.dataset.uploadUrl, {
      method: "POST", body: body, credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRFToken": token ? token.value : "" }
    }).then(function (response) {
      return response.json().then(function (answer) { return { ok: response.ok, answer: answer }; });
    }).then(function (got) {
      if (!got.ok) throw new Error(got.answer.error || "The files could not be uploaded.");
      attachedNames = got.answer.saved;
      form.requestSubmit();
    }).catch(function (error) {
      if (notice) {
        notice.className = "notice notice-error";
        notice.textContent = error.message || "The files could not be uploaded. Try again.";
      }
    });
  }
  document.addEventListener("htmx:wsConfigSend", function (evt) {
    var input = $("message-input");
    if (!input || !evt.detail.elt || evt.detail.elt.id !== "composer") return;
    var size = messageLength(input);
    if (size.max && size.n > size.max) {
      evt.preventDefault();
      var notice = $("notice");
      if (notice) {
        notice.className = "notice notice-error";
        notice.textContent = "Messages are limited to " + size.max.toLocaleString("en-US") +
          " characters; this one has " + size.n.toLocaleString("en-US") +
          ". Shorten it, or put the text in a file.";
      }
    }
  });
  // (After the length check: a message too long uploads nothing.)
  document.addEventListener("htmx:wsConfigSend", function (evt) {
    if (!evt.detail.elt || evt.detail.elt.id !== "composer" || evt.defaultPrevented) return;
    if (attachedNames) {
      // Uploaded already: sent again as they are if this message is refused.
      evt.detail.parameters.files = attachedNames;
    } else {
      delete evt.detail.parameters.files;
      if (attachments.length) {
        evt.preventDefault();
        uploadThenSend(evt.detail.elt);
      }
    }
  });

  // Cards by keyboard and for screen readers: a new card takes focus (unless
  // the member is typing), a/d/e decide the focused card, focus then moves to
  // the next waiting card or back to the message box, and a live region says
  // what came and what was decided.
  var cardStates = null;
  function say(text) {
    var announcer = $("announcer");
    if (!announcer) return;
    announcer.textContent = "";
    setTimeout(function () { announcer.textContent = text; }, 50);
  }
  function waitingCards() {
    return Array.prototype.slice.call(
      document.querySelectorAll('#transcript .tool-card[data-status="pending"]'));
  }
  function focusNext() {
    var next = waitingCards()[0];
    if (next) { next.focus(); return; }
    var input = $("message-input");
    if (input) input.focus();
  }
  function watchCards() {
    if (!$("transcript")) return;
    var states = {};
    document.querySelectorAll("#transcript .tool-card[id]").forEach(function (card) {
      states[card.id] = card.dataset.status;
    });
    if (cardStates === null) { cardStates = states; return; }  // the page as it loaded
    var arrived = [];
    Object.keys(states).forEach(function (id) {
      var before = cardStates[id];
      var card = $(id);
      if (!before && states[id] === "pending") arrived.push(card);
      if (before === "pending" && states[id] !== "pending") {
        say(card.getAttribute("aria-label"));
      }
    });
    cardStates = states;
    if (arrived.length) {
      say(arrived.length === 1 ? arrived[0].getAttribute("aria-label")
        : arrived.length + " calls waiting for a decision");
      var input = $("message-input");
      var typing = input && document.activeElement === input && input.value.trim();
      if (!typing) arrived[0].focus();
    }
    // Focus was in a card that is decided now (and swapped out): on to the
    // next waiting card or the message box, never left on <body>.
    // (htmx gives focus back to the element of the same id after a swap: the
    // decided card itself.)
    if (focusedCard && states[focusedCard] !== "pending") {
      var active = document.activeElement;
      var decided = $(focusedCard);
      focusedCard = null;
      if (!active || active === document.body || (decided && decided.contains(active))) {
        focusNext();
      }
    }
  }
  var focusedCard = null;
  document.addEventListener("focusin", function (evt) {
    var card = evt.target && evt.target.closest && evt.target.closest(".tool-card[id]");
    // (A decided card taking focus is htmx's swap giving it back: keep the mark.)
    if (card && card.dataset.status === "pending") focusedCard = card.id;
    else if (!card) focusedCard = null;
  });
  document.addEventListener("htmx:wsAfterMessage", watchCards);
  document.addEventListener("htmx:afterSettle", watchCards);
  document.addEventListener("DOMContentLoaded", watchCards);
  document.addEventListener("keydown", function (evt) {
    if (evt.ctrlKey || evt.metaKey || evt.altKey || evt.isComposing) return;
    var t = evt.target;
    if (!t || !t.closest || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName)) return;
    var card = t.closest('.tool-card[data-status="pending"]');
    if (!card) return;
    var key = evt.key.toLowerCase();
    var button = key === "a" ? card.querySelector("button[value=allow]")
      : key === "d" ? card.querySelector("button[value=deny]") : null;
    if (button) { evt.preventDefault(); button.click(); return; }
    if (key === "e") {
      var edit = card.querySelector("details.edit-menu");
      if (!edit) return;
      evt.preventDefault();
      edit.open = true;
      var field = edit.querySelector("textarea, input[type=text]");
      if (field) field.focus();
    }
  });

  var lastSeq = "0";
  document.addEventListener("htmx:wsAfterMessage", function () {
    // The server acknowledges each message: clear the box only when it was
    // accepted, so a refused message is not lost.
    var state = $("composer-state");
    if (state && state.dataset.seq !== lastSeq) {
      lastSeq = state.dataset.seq;
      if (state.dataset.state === "accepted") {
        var input = $("message-input");
        if (input) input.value = "";
        attachments = [];
        attachedNames = null;
        showAttachments();
      }
    }
    // A message can arrive both in a catch-up and as a live event; keep one.
    var seen = {};
    document.querySelectorAll("#transcript .msg[id]").forEach(function (el) {
      if (seen[el.id]) el.remove(); else seen[el.id] = true;
    });
    stickToBottom();
  });

  // The view follows the conversation's end (the last message, a waiting
  // card's controls, a result) unless the member scrolled up to read. Its
  // end is the chat column's, above the pinned message box: never the page's,
  // which on a new chat is the bottom of the settings and files beside it.
  var transcriptNearBottom = true;
  function chatEnd() { return $("chat-end"); }
  document.addEventListener("scroll", function () {
    var end = chatEnd();
    if (end) transcriptNearBottom = end.getBoundingClientRect().bottom <= window.innerHeight + 160;
  }, { passive: true });
  function stickToBottom() {
    var end = chatEnd();
    if (transcriptNearBottom && end) end.scrollIntoView({ block: "end" });
  }

  // A decision that could not be sent: say so (with the server's reason for
  // a refused one, e.g. edited arguments that fail the tool's schema); htmx
  // re-enables the buttons.
  function decisionFailed(evt) {
    var form = evt.detail.elt && evt.detail.elt.closest && evt.detail.elt.closest("form.decide");
    if (!form) return;
    var msg = form.querySelector(".decide-error");
    if (!msg) return;
    var xhr = evt.detail.xhr;
    var plain = xhr && (xhr.status === 400 || xhr.status === 403) &&
      (xhr.getResponseHeader("Content-Type") || "").indexOf("text/plain") === 0;
    msg.textContent = plain ? xhr.responseText : "Could not send your decision. Try again.";
    msg.hidden = false;
  }
  // In DEBUG, django-htmx replaces the page with any 400/403 answer; a refused
  // decision is an expected answer, shown in its card instead.
  document.addEventListener("htmx:beforeOnLoad", function (evt) {
    var elt = evt.detail.elt;
    var status = evt.detail.xhr.status;
    if ((status === 400 || status === 403) && elt && elt.closest && elt.closest("form.decide")) {
      evt.stopPropagation();
    }
  }, true);
  document.addEventListener("htmx:responseError", decisionFailed);
  document.addEventListener("htmx:sendError", decisionFailed);
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var form = evt.detail.elt && evt.detail.elt.closest && evt.detail.elt.closest("form.decide");
    if (form) {
      var msg = form.querySelector(".decide-error");
      if (msg) msg.hidden = true;
    }
  });

  // "Allow all / Deny all" covers the cards of its turn that still wait:
  // cards decided alone leave the group, and a group of one is no group.
  function pruneBatches() {
    document.querySelectorAll(".batch form").forEach(function (form) {
      var left = 0;
      form.querySelectorAll("input[name=approval_id]").forEach(function (input) {
        var card = $("approval-" + input.value);
        if (card && card.dataset.status !== "pending") input.remove(); else left += 1;
      });
      if (left < 2) { form.remove(); return; }
      var count = form.querySelector("[data-batch-count]");
      if (count) count.textContent = left;
    });
  }
  document.addEventListener("htmx:wsAfterMessage", pruneBatches);
  document.addEventListener("htmx:afterSettle", pruneBatches);

  // The header's count of waiting approvals leads the tab's title: "(2) …".
  function syncTitle() {
    var badge = $("approvals-count");
    if (!badge) return;
    var n = parseInt(badge.dataset.pendingCount || "0", 10);
    var base = document.title.replace(/^\(\d+\) /, "");
    document.title = n > 0 ? "(" + n + ") " + base : base;
  }

  // The inbox: one entry per approval (a live add can meet a catch-up), a
  // decided one says what became of it for a moment, the filters apply to
  // whatever arrives, one turn's calls can be decided together, and a word
  // when nothing waits (or nothing matches).
  var DECIDED_SECONDS = 4;
  function tidyInbox() {
    var list = $("inbox-list");
    if (!list) return;
    var seen = {};
    list.querySelectorAll(".inbox-entry[id]").forEach(function (el) {
      if (seen[el.id]) el.remove(); else seen[el.id] = true;
    });
    list.querySelectorAll(".inbox-decided:not([data-leaving])").forEach(function (el) {
      el.dataset.leaving = "1";
      setTimeout(function () { el.remove(); tidyInbox(); }, DECIDED_SECONDS * 1000);
    });
    var filters = {};
    document.querySelectorAll(".inbox-filters [data-filter]").forEach(function (select) {
      if (select.value) filters[select.dataset.filter] = select.value;
    });
    var waiting = list.querySelectorAll(".inbox-entry:not(.inbox-decided)");
    var shown = 0;
    waiting.forEach(function (el) {
      var match = Object.keys(filters).every(function (key) {
        return el.getAttribute("data-" + key) === filters[key];
      });
      el.hidden = !match;
      if (match) shown++;
    });
    turnBatches(list);
    var empty = document.querySelector(".inbox-empty");
    if (empty) empty.hidden = waiting.length > 0 || list.querySelector(".inbox-decided") !== null;
    var filtered = document.querySelector(".inbox-filtered");
    if (filtered) filtered.hidden = !(waiting.length > 0 && shown === 0);
  }
  // "Allow all / Deny all" above the shown calls of one turn (one run waits on
  // one turn at a time), as the chat offers.
  function turnBatches(list) {
    var runs = {};
    list.querySelectorAll(".inbox-entry:not(.inbox-decided):not([hidden])").forEach(function (el) {
      var run = el.dataset.run;
      if (run) (runs[run] = runs[run] || []).push(el);
    });
    list.querySelectorAll(".inbox-batch").forEach(function (bar) {
      var entries = runs[bar.dataset.run] || [];
      var ids = entries.map(function (el) { return el.dataset.inboxEntry; }).join(" ");
      if (entries.length < 2 || bar.dataset.ids !== ids || bar.nextElementSibling !== entries[0]) bar.remove();
    });
    Object.keys(runs).forEach(function (run) {
      var entries = runs[run];
      if (entries.length < 2) return;
      var ids = entries.map(function (el) { return el.dataset.inboxEntry; });
      var prev = entries[0].previousElementSibling;
      if (prev && prev.classList.contains("inbox-batch") && prev.dataset.ids === ids.join(" ")) return;
      var form = document.createElement("form");
      form.className = "inbox-batch batch";
      form.method = "post";
      form.action = list.dataset.batchUrl;
      form.dataset.run = run;
      form.dataset.ids = ids.join(" ");
      form.setAttribute("hx-post", list.dataset.batchUrl);
      form.setAttribute("hx-swap", "none");
      form.setAttribute("hx-disabled-elt", "find button");
      var csrf = (document.cookie.match(/(?:^|; )csrftoken=([^;]+)/) || [])[1] || "";
      var html = '<input type="hidden" name="csrfmiddlewaretoken" value="' + csrf + '">';
      ids.forEach(function (id) { html += '<input type="hidden" name="approval_id" value="' + id + '">'; });
      html += '<span class="muted">' + ids.length + " calls of one turn wait:</span> " +
        '<button type="submit" name="decision" value="allow" class="primary">Allow all ' + ids.length + "</button> " +
        '<button type="submit" name="decision" value="deny" class="danger">Deny all ' + ids.length + "</button>";
      form.innerHTML = html;
      entries[0].parentNode.insertBefore(form, entries[0]);
      if (window.htmx) htmx.process(form);
    });
  }
  document.addEventListener("change", function (evt) {
    if (evt.target.closest && evt.target.closest(".inbox-filters")) tidyInbox();
  });

  // A new card while the page is in the background: a browser notification
  // (the member opted in on the inbox page; the server only sends then).
  var notified = {};
  function notifyNewCard() {
    var note = $("inbox-notify");
    var id = note && note.dataset.approvalId;
    if (!id || notified[id]) return;
    notified[id] = true;
    if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
    var n = new Notification(note.dataset.title, { body: note.dataset.body, tag: id });
    var url = note.dataset.url;
    n.onclick = function () {
      window.focus();
      var card = $("approval-" + id);
      if (card) card.scrollIntoView({ block: "center" }); else window.location.href = url;
      n.close();
    };
  }

  document.addEventListener("change", function (evt) {
    var t = evt.target;
    if (t && t.id === "notify-toggle" && t.checked && "Notification" in window &&
        Notification.permission === "default") {
      Notification.requestPermission();
    }
  });


  // The sidebar on a narrow screen: the head's link opens it as a drawer
  // (on a wide one it is always shown and the link is hidden). Escape, the
  // close button or a click outside closes it, and focus goes back.
  var DRAWER = "(max-width: 1199.98px)";
  function drawer(open) {
    var sidebar = $("sidebar");
    var toggle = document.querySelector(".sidebar-toggle");
    if (!sidebar || !toggle) return;
    sidebar.classList.toggle("open", open);
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
    if (open) {
      var search = $("conversation-search");
      if (search) search.focus();
    } else if (sidebar.contains(document.activeElement)) {
      toggle.focus();
    }
  }
  document.addEventListener("click", function (evt) {
    var sidebar = $("sidebar");
    if (!sidebar) return;
    if (evt.target.closest(".sidebar-toggle") && window.matchMedia(DRAWER).matches) {
      evt.preventDefault();
      drawer(!sidebar.classList.contains("open"));
    } else if (evt.target.closest(".sidebar-close")) {
      drawer(false);
    } else if (sidebar.classList.contains("open") && !sidebar.contains(evt.target)) {
      drawer(false);
    }
  });
  document.addEventListener("keydown", function (evt) {
    var sidebar = $("sidebar");
    if (evt.key === "Escape" && sidebar && sidebar.classList.contains("open")) drawer(false);
  });

  // A chat's ⋯ menu floats by its button, below it or, near the bottom of
  // the screen, above it; one is open at a time, and a click outside or
  // Escape closes it (focus back on its button).
  function placeMenu(menu) {
    var body = menu.querySelector(".item-menu-body");
    var at = menu.querySelector("summary").getBoundingClientRect();
    var width = body.offsetWidth, height = body.offsetHeight;
    var left = Math.max(8, Math.min(at.right - width, window.innerWidth - width - 8));
    var below = window.innerHeight - at.bottom;
    var top = below >= height + 8 || below >= at.top ? at.bottom + 4 : at.top - height - 4;
    body.style.left = left + "px";
    body.style.top = Math.max(8, top) + "px";
  }
  function openMenus() {
    return Array.prototype.slice.call(document.querySelectorAll("details.item-menu[open]"));
  }
  document.addEventListener("toggle", function (evt) {
    var menu = evt.target;
    if (!menu.classList || !menu.classList.contains("item-menu") || !menu.open) return;
    openMenus().forEach(function (other) { if (other !== menu) other.open = false; });
    placeMenu(menu);
  }, true);
  document.addEventListener("click", function (evt) {
    openMenus().forEach(function (menu) { if (!menu.contains(evt.target)) menu.open = false; });
  });
  document.addEventListener("keydown", function (evt) {
    if (evt.key !== "Escape") return;
    var menus = openMenus();
    if (!menus.length) return;
    evt.stopImmediatePropagation();  // the menu closes, not the drawer around it
    menus.forEach(function (menu) { menu.open = false; menu.querySelector("summary").focus(); });
  }, true);
  window.addEventListener("resize", function () { openMenus().forEach(placeMenu); });
  document.addEventListener("scroll", function () { openMenus().forEach(placeMenu); }, true);

  // A sidebar form the server refused (an empty name, a chat whose run goes
  // on): its reason, in the form.
  function formRefused(evt) {
    var form = evt.detail.elt && evt.detail.elt.closest && evt.detail.elt.closest("form[data-errors]");
    var msg = form && form.querySelector(".form-error");
    if (!msg) return;
    var xhr = evt.detail.xhr;
    var plain = xhr && xhr.status === 400 &&
      (xhr.getResponseHeader("Content-Type") || "").indexOf("text/plain") === 0;
    msg.textContent = plain ? xhr.responseText : "That did not work. Try again.";
    msg.hidden = false;
  }
  document.addEventListener("htmx:beforeOnLoad", function (evt) {
    var elt = evt.detail.elt;
    if (evt.detail.xhr.status === 400 && elt && elt.closest && elt.closest("form[data-errors]")) {
      evt.stopPropagation();
    }
  }, true);
  document.addEventListener("htmx:responseError", formRefused);
  document.addEventListener("htmx:sendError", formRefused);

  // An upload that landed leaves its form empty for the next one.
  document.addEventListener("htmx:afterRequest", function (evt) {
    var form = evt.detail.elt;
    if (evt.detail.successful && form && form.classList && form.classList.contains("upload-form")) {
      form.reset();
    }
  });

  // The chat's title, as the server renames it (its first message names it),
  // follows in the sidebar's entry and the window's title.
  function syncChatTitle() {
    var h1 = $("conversation-title");
    var layout = document.querySelector(".chat-layout[data-conversation]");
    if (!h1 || !layout) return;
    var title = h1.textContent;
    var entry = document.querySelector('#conversation-list li[data-conversation="' +
      layout.dataset.conversation + '"] .conversation-title');
    if (entry && entry.textContent !== title) entry.textContent = title;
    var suffix = " · Studio";
    var count = (document.title.match(/^\(\d+\) /) || [""])[0];
    if (document.title !== count + title + suffix) document.title = count + title + suffix;
  }

  function afterLiveUpdate() { syncChatTitle(); syncTitle(); tidyInbox(); notifyNewCard(); }
  document.addEventListener("htmx:wsAfterMessage", afterLiveUpdate);
  document.addEventListener("htmx:afterSettle", afterLiveUpdate);
  document.addEventListener("DOMContentLoaded", function () { syncTitle(); tidyInbox(); });

  document.addEventListener("DOMContentLoaded", function () {
    var end = chatEnd();
    if (!end) return;
    // The message box in view at every width: the conversation's end, not the page's.
    end.scrollIntoView({ block: "end" });
    // And the cursor in it, where a keyboard is (on a touch screen, focus would
    // open the on-screen keyboard over the chat).
    var input = $("message-input");
    if (input && !window.matchMedia("(hover: none)").matches) input.focus({ preventScroll: true });
  });
  // A decision swaps its card in place: its result follows, as new messages do.
  document.addEventListener("htmx:afterSettle", function (evt) {
    if (evt.detail.elt && evt.detail.elt.closest && evt.detail.elt.closest("#transcript")) stickToBottom();
  });
})();
