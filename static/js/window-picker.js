// The time-window picker (templates/dashboard/_window_picker.html): a date typed into From or To
// chooses "custom", else the page would draw the preset still checked and ignore the dates.
(function () {
  "use strict";
  document.addEventListener("input", (event) => {
    const field = event.target;
    if (!(field instanceof HTMLInputElement) || !["since", "until"].includes(field.name)) return;
    const custom = field.form && field.form.querySelector('input[name="window"][value="custom"]');
    if (custom) custom.checked = true;
  });
})();
