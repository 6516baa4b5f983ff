// wurk dashboard: confirmations, select-all, relative times, and the graphs.
// No framework, no build step; loaded with defer from the package's own files.
"use strict";
(function () {
  var body = document.body;
  var base = body.dataset.base || "";

  // A form, or the button that sent it, with data-confirm asks before it is sent.
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var message = (button && button.dataset && button.dataset.confirm) ||
      (event.target.dataset && event.target.dataset.confirm);
    if (message && !window.confirm(message)) { event.preventDefault(); }
  });

  var all = document.getElementById("check-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll('input[name="key"][form="bulk"]').forEach(function (box) {
        box.checked = all.checked;
      });
    });
  }

  var units = [[31536000, "year"], [2592000, "month"], [86400, "day"], [3600, "hour"],
               [60, "minute"], [1, "second"]];
  function relative(at) {
    var delta = Date.now() / 1000 - at;
    if (Math.abs(delta) < 1) { return "just now"; }
    var secs = Math.abs(delta);
    for (var i = 0; i < units.length; i++) {
      if (secs >= units[i][0]) {
        var n = Math.floor(secs / units[i][0]);
        var text = n + " " + units[i][1] + (n === 1 ? "" : "s");
        return delta > 0 ? text + " ago" : "in " + text;
      }
    }
    return "just now";
  }
  function refreshTimes() {
    document.querySelectorAll("time[data-at]").forEach(function (el) {
      el.textContent = relative(parseFloat(el.dataset.at));
    });
  }
  setInterval(refreshTimes, 10000);

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }
  function fmt(n) { return Math.round(n).toLocaleString("en-US"); }

  // Lines of one or more series on a canvas, scaled to the largest value.
  function draw(canvas, series, labels) {
    var ratio = window.devicePixelRatio || 1;
    var width = canvas.clientWidth, height = canvas.clientHeight;
    canvas.width = width * ratio; canvas.height = height * ratio;
    var ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    var max = 1;
    series.forEach(function (s) { s.values.forEach(function (v) { if (v > max) { max = v; } }); });
    var left = 56, right = 10, top = 10, bottom = 22;
    var w = width - left - right, h = height - top - bottom;
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = css("--muted"); ctx.strokeStyle = css("--line"); ctx.lineWidth = 1;
    for (var g = 0; g <= 4; g++) {
      var y = top + h - (h * g) / 4;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + w, y); ctx.stroke();
      var tick = (max * g) / 4;
      ctx.fillText(max < 10 ? tick.toFixed(1) : fmt(tick), 4, y + 4);
    }
    if (labels && labels.length) {
      ctx.fillText(labels[0], left, height - 6);
      var last = labels[labels.length - 1];
      ctx.fillText(last, left + w - ctx.measureText(last).width, height - 6);
    }
    series.forEach(function (s) {
      var n = s.values.length;
      if (!n) { return; }
      ctx.strokeStyle = css(s.color); ctx.lineWidth = 2; ctx.beginPath();
      s.values.forEach(function (v, i) {
        var x = left + (n === 1 ? w : (w * i) / (n - 1));
        var yy = top + h - (h * v) / max;
        if (i === 0) { ctx.moveTo(x, yy); } else { ctx.lineTo(x, yy); }
      });
      ctx.stroke();
    });
  }

  var history = document.getElementById("history");
  var historyData = document.getElementById("history-data");
  function drawHistory() {
    if (!history || !historyData) { return; }
    var data = JSON.parse(historyData.textContent);
    draw(history, [{values: data.processed, color: "--processed"},
                   {values: data.failed, color: "--failed"}], data.dates);
  }
  drawHistory();

  var live = document.getElementById("live");
  if (live) {
    var poll = Math.max(1, parseFloat(body.dataset.poll) || 5);
    var points = {processed: [], failed: []}, previous = null, keep = 60;
    var tick = function () {
      fetch(base + "/stats.json", {credentials: "same-origin", cache: "no-store"})
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (s) {
          document.querySelectorAll("[data-stat]").forEach(function (el) {
            var v = s[el.dataset.stat];
            if (typeof v === "number") { el.textContent = fmt(v); }
          });
          if (previous) {
            var dt = Math.max(0.001, s.at - previous.at);
            ["processed", "failed"].forEach(function (k) {
              var rate = Math.max(0, (s[k] - previous[k]) / dt);
              points[k].push(rate);
              if (points[k].length > keep) { points[k].shift(); }
              var el = document.querySelector('[data-rate="' + k + '"]');
              if (el) { el.textContent = rate.toFixed(1); }
            });
            draw(live, [{values: points.processed, color: "--processed"},
                        {values: points.failed, color: "--failed"}]);
          }
          previous = s;
        })
        .catch(function () { /* the next tick tries again */ });
    };
    tick();
    setInterval(tick, poll * 1000);
    draw(live, []);
  }
  // Bars: one per bucket, labels under the first, middle and last.
  function bars(canvas, values, labels) {
    var ratio = window.devicePixelRatio || 1;
    var width = canvas.clientWidth, height = canvas.clientHeight;
    canvas.width = width * ratio; canvas.height = height * ratio;
    var ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    var max = Math.max.apply(null, [1].concat(values));
    var left = 56, right = 10, top = 10, bottom = 22;
    var w = width - left - right, h = height - top - bottom, n = values.length || 1;
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = css("--muted"); ctx.strokeStyle = css("--line");
    for (var g = 0; g <= 4; g++) {
      var y = top + h - (h * g) / 4;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + w, y); ctx.stroke();
      ctx.fillText(fmt((max * g) / 4), 4, y + 4);
    }
    [0, Math.floor(n / 2), n - 1].forEach(function (i) {
      if (labels[i]) { ctx.fillText(labels[i], left + (w * i) / n, height - 6); }
    });
    ctx.fillStyle = css("--processed");
    values.forEach(function (v, i) {
      var bh = (h * v) / max;
      ctx.fillRect(left + (w * i) / n + 1, top + h - bh, Math.max(1, w / n - 2), bh);
    });
  }

  var classData = document.getElementById("class-data");
  function drawClass() {
    if (!classData) { return; }
    var data = JSON.parse(classData.textContent);
    var gram = document.getElementById("histogram");
    if (gram) { bars(gram, data.histogram, data.labels); }
    var runs = document.getElementById("executions");
    if (runs) {
      draw(runs, [{values: data.processed, color: "--processed"},
                  {values: data.failed, color: "--failed"}], data.minutes);
    }
  }
  drawClass();

  window.addEventListener("resize", drawHistory);
  window.addEventListener("resize", drawClass);
})();
