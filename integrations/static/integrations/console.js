/* dropportal's console: the copy buttons beside shortened identifiers
   (integrations/admin/display.py). Says "Copied" in the button's name for screen readers. */
document.addEventListener("click", function (event) {
  var button = event.target.closest ? event.target.closest("button.dp-copy") : null;
  if (!button) return;
  event.preventDefault();
  var text = button.getAttribute("data-copy");
  var done = function () {
    button.classList.add("dp-copied");
    button.setAttribute("aria-label", "Copied " + text);
    setTimeout(function () {
      button.classList.remove("dp-copied");
      button.setAttribute("aria-label", "Copy " + text);
    }, 1500);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, function () {});
    return;
  }
  var area = document.createElement("textarea");  // plain http off loopback: the old way
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  try { document.execCommand("copy"); done(); } finally { document.body.removeChild(area); }
});
