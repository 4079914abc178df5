// Copy buttons: <button data-copy="ID"> copies the text of the element with that id. Without
// the Clipboard API (a page served over plain http to another host) it selects the text, so
// Ctrl+C copies it, and says so.
(function () {
  "use strict";
  function select(element) {
    var range = document.createRange();
    range.selectNodeContents(element);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-copy]");
    if (!button) { return; }
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) { return; }
    var label = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", label);
    function said(text) {
      button.textContent = text;
      window.setTimeout(function () { button.textContent = label; }, 2000);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(source.textContent).then(
        function () { said("Copied"); },
        function () { select(source); said("Selected: press Ctrl+C"); }
      );
    } else {
      select(source);
      said("Selected: press Ctrl+C");
    }
  });
})();
