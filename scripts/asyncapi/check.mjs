// Parse an AsyncAPI document with @asyncapi/parser (the AsyncAPI project's own parser, which
// validates it against the specification's JSON schema and its Spectral rules) and print every
// diagnostic. Exit status: 0 when there are none of severity error or warning, 1 otherwise,
// 2 for a usage error. Called by scripts/check-asyncapi.
import { Parser, fromFile } from "@asyncapi/parser";

// Spectral's severities: 0 error, 1 warning, 2 information, 3 hint.
const SEVERITY = ["error", "warning", "information", "hint"];
const FAILING = 1;

const [path] = process.argv.slice(2);
if (!path || process.argv.length !== 3) {
  process.stderr.write("usage: node check.mjs ASYNCAPI_FILE\n");
  process.exit(2);
}

const { document, diagnostics } = await fromFile(new Parser(), path).parse();
for (const diagnostic of diagnostics) {
  const where = diagnostic.path.length ? diagnostic.path.join(".") : "(document)";
  const severity = SEVERITY[diagnostic.severity] ?? String(diagnostic.severity);
  process.stdout.write(`${path}: ${severity} ${diagnostic.code} at ${where}: ${diagnostic.message}\n`);
}
const failing = diagnostics.filter((diagnostic) => diagnostic.severity <= FAILING);
if (document === undefined || failing.length > 0) {
  process.stderr.write(`${path}: ${failing.length} errors or warnings of @asyncapi/parser\n`);
  process.exit(1);
}
process.stdout.write(`${path}: valid AsyncAPI ${document.version()}, no errors or warnings\n`);
