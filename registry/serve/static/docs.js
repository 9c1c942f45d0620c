// Swagger UI for /docs, started from a file of the server's own: the page's security policy runs no inline script.
"use strict";
window.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json", dom_id: "#swagger-ui", layout: "BaseLayout", deepLinking: true, showExtensions: true,
    showCommonExtensions: true, presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
});
