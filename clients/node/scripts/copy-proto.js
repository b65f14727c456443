// Copies the repository's proto into the package (proto/, git-ignored), so
// that the built package loads it at run time wherever it is installed.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const from = path.join(__dirname, '..', '..', '..', 'proto', 'fusebox', 'v1', 'fusebox.proto');
const to = path.join(__dirname, '..', 'proto', 'fusebox', 'v1', 'fusebox.proto');
if (fs.existsSync(from)) {
  fs.mkdirSync(path.dirname(to), { recursive: true });
  fs.copyFileSync(from, to);
} else if (!fs.existsSync(to)) {
  console.error(`copy-proto: ${from} not found`);
  process.exit(1);
}
