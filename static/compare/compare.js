// Keyboard navigation of the Compare page: n or j jumps to the next edit, p or k to the previous one.
// Edits are the elements marked data-edit, in document order; the one moved to gets the focus,
// the "current" class and is scrolled to the middle of the window.
(function () {
  "use strict";

  function edits() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-edit]"));
  }

  function focusedIndex(list) {
    var active = document.activeElement;
    var edit = active && active.closest ? active.closest("[data-edit]") : null;
    return edit ? list.indexOf(edit) : -1;
  }

  // Without a focused edit, start from the first edit at or below the top of the window.
  function startIndex(list, step) {
    var below = -1;
    for (var i = 0; i < list.length; i++) {
      if (list[i].getBoundingClientRect().top >= 0) { below = i; break; }
    }
    if (step > 0) return below === -1 ? list.length - 1 : below;
    return below <= 0 ? 0 : below - 1;
  }

  function go(step) {
    var list = edits();
    if (list.length === 0) return;
    var index = focusedIndex(list);
    index = index === -1 ? startIndex(list, step) : Math.min(Math.max(index + step, 0), list.length - 1);
    var target = list[index];
    list.forEach(function (edit) { edit.classList.toggle("current", edit === target); });
    target.focus({ preventScroll: true });
    target.scrollIntoView({ block: "center" });
    var position = document.getElementById("edit-position");
    if (position) position.textContent = "edit " + (index + 1) + " of " + list.length;
  }

  var keys = { n: 1, j: 1, p: -1, k: -1 };

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || !(event.key in keys)) return;
    var target = event.target;
    if (target && target.closest && target.closest("input, textarea, select, [contenteditable]")) return;
    event.preventDefault();
    go(keys[event.key]);
  });
})();
