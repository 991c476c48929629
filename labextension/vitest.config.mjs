// Unit tests cover the DOM-free parts (protocol, model, kernel link, throttle) in plain Node.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node'
  }
});
